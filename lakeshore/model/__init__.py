"""Pure data and transitions (no I/O): the invocation record and its checks, the state
machine that moves it (``lifecycle``), and a queue's settings (``queue_config``)."""
