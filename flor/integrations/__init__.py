"""Callbacks for the trainers people train with, over the hook-driven session API (``flor.hooks``).

``flor.integrations.lightning.FlorCallback`` (PyTorch Lightning, both namespaces) and
``flor.integrations.transformers.FlorCallback`` (Hugging Face ``Trainer``); each imports its
framework only when imported itself. Without ``--flor`` they do nothing at all.
"""
