"""Name-to-callable registries that also accept `package.module:function`.

Names come from the command line (`--model_fn`, `--input_fn`,
`--keras_model`). A miss lists what is registered, so the user sees the
choices; a `module:function` path lets users plug in their own code without
editing this package.

>>> models = Registry("model_fn")
>>> models.register("double")(lambda x: 2 * x)(21)
42
>>> models.get("os.path:basename")("/a/b")
'b'
>>> models.get("os:path.basename")("/a/b")
'b'
"""

from __future__ import annotations

import importlib
from typing import Callable, Dict, Generic, Iterator, Mapping, Optional, TypeVar

from estimator_dist.base.errors import RegistryError

T = TypeVar("T", bound=Callable)


class Registry(Generic[T]):
    """A registry of callables of one kind.

    Args:
      kind: What the registry holds, used in messages (e.g. `model_fn`).
      entries: Initial name-to-callable entries.
    """

    def __init__(self, kind: str, entries: Optional[Mapping[str, T]] = None) -> None:
        self._kind = kind
        self._entries: Dict[str, T] = {}
        for name, entry in (entries or {}).items():
            self.register(name)(entry)

    def register(self, name: str) -> Callable[[T], T]:
        """Returns a decorator that registers a callable under `name`.

        Raises:
          ValueError: if `name` is taken or contains ':'.
        """

        def decorator(entry: T) -> T:
            if ":" in name:
                raise ValueError(f"{self._kind} name {name!r} must not contain ':'.")
            if name in self._entries:
                raise ValueError(
                    f"{self._kind} {name!r} is already registered to "
                    f"{self._entries[name].__module__}; pick another name."
                )
            self._entries[name] = entry
            return entry

        return decorator

    def names(self) -> list:
        """Returns the registered names, sorted."""
        return sorted(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str) -> T:
        """Returns the callable registered as `name`, or imported from `module:attr`.

        `attr` may be dotted, `module:object.method`, for a bound method or an
        attribute of a module-level object.

        Raises:
          RegistryError: if nothing is registered under `name`, the module
            cannot be imported, or the attribute is missing or not callable.
        """
        if ":" not in name:
            if name in self._entries:
                return self._entries[name]
            raise RegistryError(
                f"Unknown {self._kind} {name!r}. Registered: {', '.join(self.names())}. "
                f"To use your own, pass 'package.module:function'."
            )
        module_name, _, attribute = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise RegistryError(
                f"Cannot import module {module_name!r} for {self._kind} {name!r}: {error}. "
                "Check the spelling and that the module is on PYTHONPATH."
            ) from None
        entry: object = module
        for part in attribute.split("."):
            entry = getattr(entry, part, None)
            if entry is None:
                break
        if not callable(entry):
            found = "nothing" if entry is None else f"a {type(entry).__name__}"
            raise RegistryError(
                f"{self._kind} {name!r}: module {module_name!r} has {found} named "
                f"{attribute!r}; expected a function, a callable object or a bound method "
                "(`module:function` or `module:object.method`)."
            )
        return entry
