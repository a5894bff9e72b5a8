"""How an engine keeps its model's state in the prefix store, one strategy per cache mode
(as vLLM's ``spec_manager_map`` picks a KV cache manager per attention type):

* :class:`~engine.cache_strategy.dense.DenseBlocks` (``dense.py``): dense attention, every
  layer's KV in shared token blocks; the live context is cut back freely;
* :class:`~engine.cache_strategy.checkpointed.Checkpointed` (``checkpointed.py``):
  sliding-window, recurrent and hybrid models, blocks plus whole checkpoints of the state
  that cannot be cut back;
* ``base.py``: what both share (restore, positioning, storing blocks).

A model whose state the store cannot keep (``CacheMode.OFF``) runs without a store and is
served by ``DenseBlocks`` for its live context, as before strategies had names.
"""

from __future__ import annotations

from engine.cache_strategy.base import CacheStrategy
from engine.cache_strategy.checkpointed import Checkpointed
from engine.cache_strategy.dense import DenseBlocks
from engine.model import CacheMode

STRATEGIES: dict[CacheMode, type[CacheStrategy]] = {
    CacheMode.BLOCKS: DenseBlocks,
    CacheMode.OFF: DenseBlocks,
    CacheMode.SWA_CHECKPOINTS: Checkpointed,
    CacheMode.RECURRENT_CHECKPOINTS: Checkpointed,
    CacheMode.HYBRID_CHECKPOINTS: Checkpointed,
}


def strategy_for(mode: CacheMode) -> type[CacheStrategy]:
    """The strategy class for a model's cache mode.

    Raises:
        KeyError: a mode with no strategy (a new ``CacheMode`` member not mapped here).
    """
    return STRATEGIES[mode]


__all__ = ["STRATEGIES", "CacheStrategy", "Checkpointed", "DenseBlocks", "strategy_for"]
