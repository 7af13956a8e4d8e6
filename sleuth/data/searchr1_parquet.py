"""Write questions as a Search-R1 training/eval parquet (schema of Search-R1's
``scripts/data_process/nq_search.py`` plus the FlashRAG columns it keeps); reading one back is
:func:`sleuth.data.qa.load_questions`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sleuth.data.qa import QADataError
from sleuth.rollout.formats import SearchR1Format, normalize_question
from sleuth.types import Question


def searchr1_rows(questions: Sequence[Question], fmt: Any = None, *, split: str = "train") -> list[dict]:
    """Search-R1's parquet rows (schema of ``nq_search.py`` plus the FlashRAG columns it keeps)."""
    fmt = fmt if fmt is not None else SearchR1Format()
    rows = []
    for index, q in enumerate(questions):
        prompt = [{"role": "user", "content": fmt.user_content(q)}]
        if fmt.system_prompt is not None:
            prompt.insert(0, {"role": "system", "content": fmt.system_prompt})
        rows.append(
            {
                "data_source": q.data_source,
                "prompt": prompt,
                "ability": "fact-reasoning",
                "reward_model": {"style": "rule", "ground_truth": {"target": list(q.golden_answers)}},
                "extra_info": {"split": split, "index": index},
                "id": str(q.meta.get("row_id", q.id)),
                "question": normalize_question(q.text),
                "golden_answers": list(q.golden_answers),
            }
        )
    return rows


def write_searchr1_parquet(
    questions: Sequence[Question], path: str | Path, fmt: Any = None, *, split: str = "train"
) -> Path:
    """Write ``questions`` as a Search-R1 training/eval parquet (prompt built by ``fmt``, default
    Search-R1's). Returns the path. Reading it back gives the same ids when ``split`` matches."""
    if not questions:
        raise QADataError(f"{path}: no questions to write")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(searchr1_rows(questions, fmt, split=split)), path)
    return path
