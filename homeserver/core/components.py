"""component: a part of a composition root, built on first use and then kept.

A build may yield (a database opens on a thread pool), so greenlets racing for one part wait
for the first build rather than make a second. The owner holds an `RLock` as `_building`
(re-entrant: one part's build asks for others).
"""

from __future__ import annotations

from typing import Any, Callable, Generic, TypeVar, overload

T = TypeVar("T")


class component(Generic[T]):
    def __init__(self, build: Callable[[Any], T]):
        self.build = build
        self.name = build.__name__
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, owner_instance: None, owner: type) -> component[T]: ...

    @overload
    def __get__(self, owner_instance: object, owner: type) -> T: ...

    def __get__(self, owner_instance, owner=None):
        if owner_instance is None:
            return self
        with owner_instance._building:
            if self.name not in owner_instance.__dict__:
                owner_instance.__dict__[self.name] = self.build(owner_instance)
        return owner_instance.__dict__[self.name]
