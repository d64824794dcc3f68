"""Instances: requests, engine limits and the time model; their files, generators and traces.

The nouns a script needs are here (``from kvsched.instances import load_instance``) and in
``kvsched`` itself. They load on first use, so importing one instance module stays light
(the file schemas pull in pydantic).
"""

from importlib import import_module

_WHERE = {
    "Instance": "kvsched.instances.model",
    "Limits": "kvsched.instances.model",
    "Request": "kvsched.instances.model",
    "TimeModel": "kvsched.instances.model",
    "load_instance": "kvsched.instances.io",
    "save_instance": "kvsched.instances.io",
}

__all__ = ["Instance", "Limits", "Request", "TimeModel", "load_instance", "save_instance"]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'kvsched.instances' has no attribute {name!r}")
