"""The collections a module may ``sow`` into for the trainer (read by ``theseus.training.steps``).

Each holds one scalar per sown name (``init_fn=lambda: 0.0, reduce_fn=operator.add`` keeps it one
value): a term added to the training loss, a metric logged per step (averaged over every place that
sows the same name; a scanned layer stack gives one per layer), and an additive update of the
module's own parameter of the same name, applied after the optimizer step (a parameter the loss does
not train, such as a load-balancing bias). Sowing is a no-op where the caller does not collect them
(generation).
"""

from __future__ import annotations

AUX_LOSSES = "aux_losses"
AUX_METRICS = "aux_metrics"
PARAM_UPDATES = "param_updates"
#: The three, for ``apply(..., mutable=AUX_COLLECTIONS)``.
AUX_COLLECTIONS = (AUX_LOSSES, AUX_METRICS, PARAM_UPDATES)

__all__ = ["AUX_COLLECTIONS", "AUX_LOSSES", "AUX_METRICS", "PARAM_UPDATES"]
