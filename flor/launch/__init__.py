"""``flor replay``: plan a replay (``estimate``), run its workers (``launcher`` with the
``local`` or ``ray`` executor) and report on it (``report``)."""
