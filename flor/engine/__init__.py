"""The engine: the sessions that record and replay a run (``session``, ``record``, ``replay``)
and the DDP helpers (``ddp``). ``flor.runtime`` picks the process's session."""
