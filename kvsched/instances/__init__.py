"""Instances: requests, engine limits and the time model; their files, generators and traces.

The nouns a script needs are here (``from kvsched.instances import load_instance``) and in
``kvsched`` itself. They load on first use, so importing one instance module stays light
(the file schemas pull in pydantic).
"""

from pathlib import Path

from kvsched.lazy import lazy_names

#: The bundled example instances: inputs, never written by kvsched (``kvsched.example(name)``).
EXAMPLES_DIR = Path(__file__).resolve().parent / "examples"

_WHERE = {
    "Instance": "kvsched.instances.model",
    "Limits": "kvsched.instances.model",
    "Request": "kvsched.instances.model",
    "TimeModel": "kvsched.instances.model",
    "load_instance": "kvsched.instances.io",
    "save_instance": "kvsched.instances.io",
}

__all__ = ["Instance", "Limits", "Request", "TimeModel", "load_instance", "save_instance"]


__getattr__, __dir__ = lazy_names("kvsched.instances", _WHERE, globals())
