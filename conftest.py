"""pytest's doctest collection imports every module of flor/: the integrations import their
framework, so a checkout without the ``lightning`` or ``transformers`` extra skips them (the
``test`` extra, which CI installs, has both)."""

from importlib.util import find_spec

collect_ignore = [path for path, package in (("flor/integrations/lightning.py", "pytorch_lightning"),
                                             ("flor/integrations/transformers.py", "transformers"))
                  if find_spec(package) is None]
