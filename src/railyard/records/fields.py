"""The one field reader for the JSON and YAML documents Railyard reads, and its one error.

Every decoder (the Allocation and topology codecs, pod records, the agent's config, cluster
files, the CNI's network config) walks its parsed document with `Fields` and reports a bad
value as a `FieldError(path, reason)` naming the field (`allocation.pairs[2].gpu.pciAddress`),
phrased one way: "expected <what>, got <kind>" (docs/decisions/0062). Pure; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from typing import Any, NoReturn

from railyard.topology.cpus import iter_cpu_ranges
from railyard.topology.model import PCI_ADDRESS_RE

_MISSING: Any = object()


# The most an error says, whatever value it quotes: errors go to kube-scheduler's answers,
# logs and Events, and a caller's 256 KiB value must not come back whole (the fuzz sweep).
MAX_ERROR_CHARS = 1024


def clipped(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """`text`, or its start and how much was left out when it is longer than `limit`."""
    if len(text) <= limit:
        return text
    return f"{text[:limit - 40]}… ({len(text) - (limit - 40)} more characters)"


class FieldError(ValueError):
    """A document with a value that cannot be used: which field (`path`), and why.

    `document`, when set, names where the document came from (a file); the message is then
    `<document>: <path>: <reason>`. Each reader has its own subclass (`RecordError`,
    `ConfigError`, …), so its callers catch what they caught before.
    """

    def __init__(self, path: str, reason: str, *, document: str = "") -> None:
        path, reason = clipped(path, MAX_ERROR_CHARS // 2), clipped(reason)
        text = f"{path}: {reason}" if path else reason
        super().__init__(clipped(f"{document}: {text}" if document else text))
        self.path = path
        self.reason = reason
        self.document = document

    def under(self, prefix: str) -> FieldError:
        """This error with its path inside `prefix` (a document embedded in another)."""
        path = join(prefix, self.path) if self.path else prefix
        return type(self)(path, self.reason, document=self.document)

    def in_document(self, document: str) -> FieldError:
        """This error naming the file (or other source) its document came from."""
        return type(self)(self.path, self.reason, document=document)


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def kind_of(value: Any) -> str:
    """What a decoded JSON/YAML value is, in the words of the error messages."""
    if value is None:
        return "null"
    return _KINDS.get(type(value)) or f"a {type(value).__name__}"


_KINDS = {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
          list: "a list", dict: "an object"}

# An RFC 1123 label, as Kubernetes checks namespace and container names, full-matched.
_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)


def is_dns_label(text: str) -> bool:
    """A namespace's or a container's name as the API server allows it."""
    return _DNS_LABEL.fullmatch(text) is not None


# An RFC 1123 subdomain: labels joined by dots, at most 253 characters in all.
_SUBDOMAIN_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_SUBDOMAIN_LABEL}(?:\.{_SUBDOMAIN_LABEL})*", re.ASCII)
MAX_DNS_SUBDOMAIN = 253


def is_dns_subdomain(text: str, max_length: int = MAX_DNS_SUBDOMAIN) -> bool:
    """An object's name, a DRA driver's (at most 63) or a pool's segment, as the API server
    allows it."""
    return len(text) <= max_length and _DNS_SUBDOMAIN.fullmatch(text) is not None


def pod_namespace(meta: dict[str, Any], error: type[FieldError] = FieldError) -> str:
    """`metadata.namespace` of a pod: a namespace's name, or `default` only when missing or
    null (a pods file may leave it out, as kubectl does). Anything else is refused, never read
    as `default`: such a pod would take a default pod's record by name."""
    namespace = meta.get("namespace")
    if namespace is None:
        return "default"
    if type(namespace) is not str or not is_dns_label(namespace):
        shown = repr(namespace[:70]) if isinstance(namespace, str) else kind_of(namespace)
        raise error("metadata.namespace", "expected a namespace (a DNS label: lower-case "
                    f"letters, digits and '-', at most 63), got {shown}")
    return namespace


PCI_ADDRESS_FORM = "a PCI address (dddd:bb:dd.f, domain of 4 to 8 hex digits)"
_pci_match = PCI_ADDRESS_RE.fullmatch


class Fields:
    """One JSON object of a document, at `path`, read key by key.

    Each method returns the value with its type checked, or raises `error(path.key, reason)`;
    the path is built only when there is an error. An `optional` key (or one with a
    `default`) may be missing; null is a value like any other, refused unless the reader is
    an `…_or_null` one.
    """

    __slots__ = ("d", "error", "path")

    def __init__(self, value: Any, path: str, error: type[FieldError] = FieldError) -> None:
        if type(value) is not dict:
            raise error(path, f"expected an object, got {kind_of(value)}")
        self.d: dict[str, Any] = value
        self.path = path
        self.error = error

    # -------------------------------------------------------------- errors and keys

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, reason: str) -> NoReturn:
        """Raise this reader's error for `key` (the object itself when `key` is empty)."""
        raise self.error(self.at(key) if key else self.path, reason)

    def expected(self, key: str, what: str, value: Any) -> NoReturn:
        self.fail(key, f"expected {what}, got {kind_of(value)}")

    def only(self, known: Collection[str], what: str = "key") -> None:
        """Refuse a key outside `known`, naming the first in sorted order."""
        unknown = [k for k in self.d if k not in known]
        if unknown:
            self.fail(str(sorted(unknown, key=str)[0]),
                      f"unknown {what} (known: {', '.join(sorted(known))})")

    def __contains__(self, key: str) -> bool:
        return key in self.d

    def get(self, key: str, default: Any = None) -> Any:
        """The raw value, unchecked (for a value the caller checks itself)."""
        return self.d.get(key, default)

    # -------------------------------------------------------------- scalars

    def string(self, key: str, *, nonempty: bool = False, default: str | None = None,
               what: str = "") -> str:
        """A string (`what` says which kind, for the message); with `default`, the key may
        be missing."""
        v = self.d.get(key, _MISSING)
        if v is _MISSING:
            if default is not None:
                return default
            self.fail(key, "missing")
        if type(v) is not str or (nonempty and not v):
            what = what or ("a non-empty string" if nonempty else "a string")
            self.fail(key, f"expected {what}, got {kind_of(v) if v != '' else 'an empty string'}")
        return v

    def string_or_null(self, key: str) -> str | None:
        """A string, or None when the key is missing or null."""
        v = self.d.get(key)
        if v is not None and type(v) is not str:
            self.expected(key, "a string or null", v)
        return v

    def one_of(self, key: str, choices: Collection[str]) -> str:
        v = self.d.get(key, _MISSING)
        if type(v) is not str:
            self.string(key)  # raises the missing or type error
        if v not in choices:
            self.fail(key, f"expected {' or '.join(repr(c) for c in choices)}, got {v!r}")
        return v

    def integer(self, key: str, minimum: int | None = 0, maximum: int | None = None, *,
                default: int | None = None) -> int:
        """An integer (never a boolean) in minimum..maximum (None: unbounded); with `default`,
        the key may be missing."""
        v = self.d.get(key, _MISSING)
        if v is _MISSING:
            if default is not None:
                return default
            self.fail(key, "missing")
        if type(v) is not int:
            self.expected(key, "an integer", v)
        if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
            bound = (f"≥ {minimum}" if maximum is None else f"≤ {maximum}" if minimum is None
                     else f"{minimum}..{maximum}")
            self.fail(key, f"expected an integer {bound}, got {v}")
        return v

    def integer_or_null(self, key: str, minimum: int | None = 0) -> int | None:
        v = self.d.get(key)
        if v is None:
            return None
        if type(v) is not int or (minimum is not None and v < minimum):
            return self.integer(key, minimum)  # raises the type or range error
        return v

    def boolean(self, key: str, default: bool) -> bool:
        """true or false; `default` when missing."""
        v = self.d.get(key, _MISSING)
        if v is _MISSING:
            return default
        if type(v) is not bool:
            self.expected(key, "true or false", v)
        return v

    def pci_address(self, key: str) -> str:
        """The one PCI-address check of every document: the kernel's form, in lower case."""
        v = self.d.get(key, _MISSING)
        if type(v) is not str:
            self.string(key)  # raises the missing or type error
        if not _pci_match(v):
            self.fail(key, f"not {PCI_ADDRESS_FORM}: {v[:40]!r}")
        return v

    def cpulist(self, key: str) -> str:
        """A kernel cpulist ("0-3,8"), ids up to MAX_CPU, in ascending order with each CPU
        once, as the kernel and `format_cpulist` write it; no white space (the kernel's final
        newline included: a record holds the list itself). Checked range by range, nothing
        expanded: "0-65535" repeated is refused at its second element."""
        v = self.string(key)
        if v.endswith("\n"):
            self.fail(key, f"bad CPU list {v[:40]!r}: ends in a newline")
        before = -1
        try:
            for first, last in iter_cpu_ranges(v):
                if first <= before:
                    element = str(first) if first == last else f"{first}-{last}"
                    raise ValueError(f"bad CPU list {v[:40]!r}: {element} does not come after "
                                     f"CPU {before} (ascending, each CPU once)")
                before = last
        except ValueError as e:
            self.fail(key, str(e))
        return v

    # -------------------------------------------------------------- containers

    def object(self, key: str, *, optional: bool = False) -> Fields:
        """A nested object; `optional`: a missing one reads as empty."""
        v = self.d.get(key, _MISSING)
        if v is _MISSING:
            if optional:
                return Fields({}, self.at(key), self.error)
            self.fail(key, "missing")
        return Fields(v, self.at(key), self.error)

    def array(self, key: str, *, optional: bool = False) -> list[Any]:
        """A list, items unchecked; `optional`: a missing one reads as empty."""
        v = self.d.get(key, _MISSING)
        if type(v) is not list:
            if v is _MISSING:
                if optional:
                    return []
                self.fail(key, "missing")
            self.expected(key, "a list", v)
        return v

    def items(self, key: str, *, optional: bool = False) -> Iterator[tuple[Any, str]]:
        """Each item of a list with its path (`key[i]`)."""
        at = self.at(key)
        for i, item in enumerate(self.array(key, optional=optional)):
            yield item, f"{at}[{i}]"

    def objects(self, key: str, *, optional: bool = False) -> Iterator[Fields]:
        """Each item of a list of objects, as a reader."""
        for item, at in self.items(key, optional=optional):
            yield Fields(item, at, self.error)

    def strings(self, key: str, *, optional: bool = False) -> list[str]:
        """A list of strings; `optional`: a missing one reads as empty."""
        v = self.array(key, optional=optional)
        for i, item in enumerate(v):
            if type(item) is not str:
                raise self.error(f"{self.at(key)}[{i}]",
                                 f"expected a string, got {kind_of(item)}")
        return v
