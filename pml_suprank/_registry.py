"""The one registry helper of the package (losses, OOD detectors and HEAT priors, retrieval metrics): an ordered,
read-only ``name -> object`` mapping filled by a decorator::

    THINGS = Registry("thing")

    @THINGS.register("my-thing", aliases=("MyThing",))   # or THINGS.register("my-thing", MyThing)
    class MyThing: ...

    THINGS.get_class("MyThing")    # -> MyThing; THINGS.names() == ("my-thing",): aliases are not names

A name or alias taken by another object is replaced with a ``UserWarning`` (``on_conflict="warn"``) or refused with
a ``ValueError`` (``"refuse"``; a class redefined under the same ``module.qualname`` only warns); never silently.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

__all__ = ["Registry"]


def _where(obj: Any) -> str:
    return f"{getattr(obj, '__qualname__', type(obj).__qualname__)} (module {getattr(obj, '__module__', '?')})"


class Registry(Mapping[str, Any]):
    """An ordered, read-only mapping ``name -> object`` (registration order) with aliases.

    Args:
        kind: What is registered, used in messages (``"detector"``, ``"HEAT prior"``, ``"metric"``).
        on_conflict: ``"warn"`` (replace with a ``UserWarning``) or ``"refuse"`` (``ValueError``) when a name or
            alias is registered again for another object.
        origin: What an entry stands for, compared on a conflict and named in messages (default: the entry itself;
            the losses register ``LossEntry`` records and compare their ``cls``).
    """

    def __init__(self, kind: str, *, on_conflict: str = "warn", origin: Callable[[Any], Any] | None = None) -> None:
        if on_conflict not in ("warn", "refuse"):
            raise ValueError(f"on_conflict must be 'warn' or 'refuse'; got {on_conflict!r}")
        self.kind, self.on_conflict = kind, on_conflict
        self._origin = origin or (lambda obj: obj)
        self._entries: dict[str, Any] = {}
        self._aliases: dict[str, str] = {}  # alias -> name

    def register(self, name: str, obj: Any = None, *, aliases: Sequence[str] = ()) -> Any:
        """Add ``obj`` under ``name`` (and ``aliases``) and return it; without ``obj``, a decorator doing so."""
        if obj is None:
            return lambda o: self.register(name, o, aliases=aliases)
        new = self._origin(obj)
        for key in (name, *aliases):
            if not isinstance(key, str) or not key:
                raise TypeError(f"a {self.kind} name must be a non-empty string; got {key!r}")
            if key != name and key in self._entries and self._origin(self._entries[key]) is not new:
                raise ValueError(f"{self.kind} alias {key!r} is the name of {_where(self._origin(self._entries[key]))}")
            old = self._entries.get(self._aliases.get(key, key))
            if old is not None and (old := self._origin(old)) is not new:
                message = f"{self.kind} {key!r} is already registered for {_where(old)}"
                redefined = isinstance(old, type) and isinstance(new, type) and _where(old) == _where(new)
                if self.on_conflict == "refuse" and not redefined:
                    raise ValueError(message)
                warnings.warn(f"{message}; replacing it with {_where(new)}", UserWarning, stacklevel=3)
        self._entries[name] = obj
        self._aliases.pop(name, None)
        self._aliases.update(dict.fromkeys(aliases, name))
        return obj

    def unregister(self, name: str) -> Any:
        """Remove and return the object registered under ``name`` with its aliases (``ValueError`` if none)."""
        obj = self.get_class(name)
        name = self._aliases.get(name, name)
        del self._entries[name]
        self._aliases = {a: n for a, n in self._aliases.items() if n != name}
        return obj

    def get_class(self, name: Any) -> Any:
        """The object registered under ``name`` or an alias of it; ``ValueError`` listing the valid names otherwise."""
        if isinstance(name, str) and self._aliases.get(name, name) in self._entries:
            return self._entries[self._aliases.get(name, name)]
        raise ValueError(f"unknown {self.kind} {name!r}; expected one of {list(self._entries)}")

    def names(self) -> tuple[str, ...]:
        """Registered names (not the aliases), in registration order."""
        return tuple(self._entries)

    def aliases(self) -> dict[str, str]:
        """``{alias: name}`` of every alias."""
        return dict(self._aliases)

    def __getitem__(self, name: str) -> Any:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"
