"""The engine: per-request steps (``simulation``), the sequential and discrete-event drivers
(``drivers``) and the metrics recorder (``metrics``)."""
