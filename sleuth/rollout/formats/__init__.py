"""Protocol formats (see :mod:`sleuth.rollout.formats.base` for the interface and the parsing rules
they share). Importing this package registers every format: ``FORMATS`` maps a name to its class,
``get_format(name)`` builds one."""

from sleuth.rollout.formats.base import (
    FORMATS,
    PROMPT_VARIANTS,
    ProtocolFormat,
    WorkedExample,
    first_complete_tag,
    format_names,
    get_format,
    last_tag_content,
    no_action_reason,
    normalize_question,
    register,
    register_prompt_variant,
    remove_blocks,
    worked_examples,
)
from sleuth.rollout.formats.r1_searcher import R1SearcherFormat
from sleuth.rollout.formats.search_r1 import (
    FEWSHOT_EXAMPLE,
    SEARCH_R1_INSTRUCTION,
    SEARCH_R1_INVALID,
    TINY_INSTRUCTION,
    FewShotSearchR1Format,
    SearchR1Format,
    TinySearchR1Format,
    render_passages_search_r1,
)
from sleuth.rollout.formats.tool_call import ToolCallFormat

__all__ = [
    "FEWSHOT_EXAMPLE", "FORMATS", "FewShotSearchR1Format", "PROMPT_VARIANTS", "ProtocolFormat", "R1SearcherFormat",
    "SEARCH_R1_INSTRUCTION", "SEARCH_R1_INVALID", "SearchR1Format", "TINY_INSTRUCTION", "TinySearchR1Format",
    "ToolCallFormat", "WorkedExample", "first_complete_tag", "format_names", "get_format", "last_tag_content",
    "no_action_reason", "normalize_question", "register", "register_prompt_variant", "remove_blocks",
    "render_passages_search_r1", "worked_examples",
]
