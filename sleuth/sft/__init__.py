"""Supervised fine-tuning on protocol transcripts (``sleuth sft``): a cold start before RL.

``transcripts`` (the transcript type, its JSONL form, the ``trajectories`` source and the encoding
the rollout would produce), ``synthesize`` (transcripts from QA files and a retriever), ``loop``
(the run: checkpoints, exact resume, metrics), ``cli``."""
