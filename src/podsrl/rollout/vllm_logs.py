"""vLLM log records that the way podsrl runs its engine makes expected, filtered out so that
real warnings stand out (:mod:`podsrl.rollout.vllm`)."""

from __future__ import annotations

import logging


class _ExpectedWarnings(logging.Filter):
    """vLLM warnings that the way podsrl runs the engine makes expected, dropped so that real ones
    stand out: with ``skip_tokenizer_init`` (podsrl tokenizes and decodes itself, and passes the
    EOS token with each request) vLLM's chat-template warm-up fails with a traceback and its EOS
    id is None; a weight push carries no rotary cache and, for a head tied to the embedding, no
    head weights (``podsrl.rollout.vllm._repack_tied_head`` repacks that head after each push)."""

    def __init__(self, tied_head: bool) -> None:
        super().__init__()
        self.expected = ("Chat template warmup failed",
                         "Using None for EOS token id because tokenizer is not",
                         "RotaryEmbedding: Failed to load weights",
                         *(("ParallelLMHead: Failed to load weights",) if tied_head else ()))

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.expected)


# the vLLM modules that log them (vllm.logger.init_logger(__name__)); a logger's filter sees its own records
EXPECTED_WARNING_LOGGERS = ("vllm.renderers.base", "vllm.model_executor.model_loader.reload.layerwise")


def hide_expected_warnings(config) -> None:
    """Drop the expected warnings of an engine built for ``config`` (one filter per logger, replaced
    on every build)."""
    for name in EXPECTED_WARNING_LOGGERS:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _ExpectedWarnings)]:
            logger.removeFilter(old)
        logger.addFilter(_ExpectedWarnings(tied_head=bool(getattr(config, "tie_word_embeddings", False))))
