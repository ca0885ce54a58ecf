"""pytest's doctest collection imports every module of flor/: the integrations import their
framework, so a checkout without the ``lightning`` or ``transformers`` extra skips them (the
``test`` extra, which CI installs, has both)."""

from importlib.util import find_spec

#: each integration module and the packages any one of which it works with
_NEEDS = {"flor/integrations/lightning.py": ("lightning", "pytorch_lightning"),
          "flor/integrations/transformers.py": ("transformers",)}

collect_ignore = [path for path, packages in _NEEDS.items() if all(find_spec(p) is None for p in packages)]
