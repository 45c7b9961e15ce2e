"""Names a package hands out from its submodules, imported on first use (so `import hasten` stays cheap).

One helper for every package that does this, instead of a copy of the same
module-level ``__getattr__`` in each.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any, Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str],
                 namespace: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of `package`, for names that live in its submodules.

    `exports` maps each name to the submodule (relative to `package`) that
    defines it; a name is imported on first access and then stored in
    `namespace` (the package's ``globals()``), so later accesses cost nothing.

    Example:
        >>> __getattr__, __dir__ = lazy_exports("json", {"JSONDecoder": "decoder"}, {})
        >>> __getattr__("JSONDecoder").__name__
        'JSONDecoder'
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            # a submodule reads as an attribute after `import hasten`, as Accelerate's eager imports make
            # `accelerate.state` work after `import accelerate`
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value  # later accesses skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace.get("__all__", ()), *namespace})

    return __getattr__, __dir__
