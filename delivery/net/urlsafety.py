"""Outbound URL policy: which remote URLs the fetcher may touch at all.

Pure functions, no I/O. ``check_url`` vets what can be decided from the URL itself (scheme,
userinfo, host-name shape, literal addresses); ``check_ip`` vets one resolved address and is
called by the fetcher on every DNS answer and every redirect hop. Every refusal raises
``RefusedURL`` whose ``reason`` names the rule that fired (it ends up in the job's fetch record).

The URL is parsed with httpx's own parser, so the host we vet is byte for byte the host the
transport will connect to — no parser differential between policy and client.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

DEFAULT_PORTS = {"https": 443, "http": 80}

# Names that never point at the public internet (RFC 6761 / 6762 / 8375 / 9476 and the usual
# cloud metadata names). Matched as the whole name or as a suffix after a dot.
INTERNAL_SUFFIXES = (
    "localhost",
    "localdomain",
    "local",
    "internal",
    "intranet",
    "lan",
    "home",
    "corp",
    "private",
    "home.arpa",
    "in-addr.arpa",
    "ip6.arpa",
    "test",
    "invalid",
    "example",
    "onion",
    "alt",
    "metadata.goog",
)

_V4 = ipaddress.IPv4Network
_V6 = ipaddress.IPv6Network

# Order matters: the first match names the rule. Special single addresses come first.
IPV4_RULES: tuple[tuple[ipaddress.IPv4Network, str], ...] = (
    (_V4("0.0.0.0/32"), "unspecified"),
    (_V4("255.255.255.255/32"), "broadcast"),
    (_V4("169.254.169.254/32"), "cloud metadata"),
    (_V4("100.100.100.200/32"), "cloud metadata"),
    (_V4("0.0.0.0/8"), "this-network"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "shared (CGNAT)"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "IETF protocol"),
    (_V4("192.0.2.0/24"), "documentation (TEST-NET-1)"),
    (_V4("192.31.196.0/24"), "AS112"),
    (_V4("192.52.193.0/24"), "AMT"),
    (_V4("192.88.99.0/24"), "6to4 relay"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("192.175.48.0/24"), "AS112"),
    (_V4("198.18.0.0/15"), "benchmarking"),
    (_V4("198.51.100.0/24"), "documentation (TEST-NET-2)"),
    (_V4("203.0.113.0/24"), "documentation (TEST-NET-3)"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("240.0.0.0/4"), "reserved"),
)

IPV6_RULES: tuple[tuple[ipaddress.IPv6Network, str], ...] = (
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("fd00:ec2::254/128"), "cloud metadata"),
    (_V6("64:ff9b:1::/48"), "local-use NAT64"),
    (_V6("100::/64"), "discard-only"),
    (_V6("2001:2::/48"), "benchmarking"),
    (_V6("2001:10::/28"), "ORCHID"),
    (_V6("2001:20::/28"), "ORCHIDv2"),
    (_V6("2001::/23"), "IETF protocol"),
    (_V6("2001:db8::/32"), "documentation"),
    (_V6("3fff::/20"), "documentation"),
    (_V6("5f00::/16"), "SRv6 SID"),
    (_V6("fc00::/7"), "unique-local"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fec0::/10"), "site-local"),
    (_V6("ff00::/8"), "multicast"),
)

_MAPPED = _V6("::ffff:0:0/96")
_TRANSLATED = _V6("::ffff:0:0:0/96")
_COMPATIBLE = _V6("::/96")
_NAT64 = _V6("64:ff9b::/96")
_SIX_TO_FOUR = _V6("2002::/16")
_TEREDO = _V6("2001::/32")
_GLOBAL_UNICAST = _V6("2000::/3")

_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
_NUMERIC_LABEL = re.compile(r"^(?:0x[0-9a-f]*|[0-9]+)$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class RefusedURL(Exception):
    """The outbound policy refuses this URL; ``reason`` names the rule that fired."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Target:
    """A URL that passed the policy checks that need no DNS."""

    url: httpx.URL
    scheme: str
    host: str  # ASCII (IDNA) host as the transport will use it, no brackets
    port: int
    ip: IPAddress | None  # set when the host is a literal address
    allow_listed: bool  # operator allow-list: exempt from https-only, name and address rules


def check_url(url: str | httpx.URL, allow_hosts: list[str] | tuple[str, ...] = ()) -> Target:
    """Vet ``url`` against the outbound policy; raise ``RefusedURL`` naming the rule."""
    text = str(url).strip() if url is not None else ""
    if not text:
        raise RefusedURL("empty URL")
    if len(text) > 8192:
        raise RefusedURL("URL longer than 8192 characters")
    if _CONTROL.search(text):
        # WHATWG parsers silently drop tabs and newlines; httpx does not — refuse both ways.
        raise RefusedURL("control character in URL")
    if " " in text.partition("://")[2].split("/", 1)[0]:
        raise RefusedURL("space in host")
    try:
        parsed = httpx.URL(text)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise RefusedURL(_unparsable_reason(text, exc)) from exc

    scheme = parsed.scheme
    if scheme not in DEFAULT_PORTS:
        raise RefusedURL(f"scheme {scheme or '(none)'} is not allowed")
    try:
        netloc = urlsplit(text).netloc
    except ValueError as exc:
        raise RefusedURL(f"invalid URL: {exc}") from exc
    if parsed.userinfo or "@" in netloc:
        raise RefusedURL("userinfo in URL")
    host = parsed.raw_host.decode("ascii").lower()
    if not host:
        raise RefusedURL("missing host")
    port = DEFAULT_PORTS[scheme] if parsed.port is None else parsed.port
    if not 0 < port < 65536:
        raise RefusedURL(f"invalid port {port}")
    allow_listed = host_allowed(host, port, allow_hosts)

    ip = _literal_ip(host)
    if ip is None:
        _check_name_shape(host)
    if scheme != "https" and not allow_listed:
        raise RefusedURL(f"scheme {scheme} is not allowed")
    if not allow_listed:
        if ip is not None:
            check_ip(ip)
        else:
            _check_public_name(host)
    return Target(parsed, scheme, host, port, ip, allow_listed)


def check_ip(ip: str | IPAddress) -> None:
    """Raise ``RefusedURL`` unless ``ip`` is a public unicast address.

    IPv4 embedded in IPv6 (mapped, NAT64, 6to4, Teredo, IPv4-compatible) is checked as IPv4.
    """
    try:
        addr = ipaddress.ip_address(ip) if isinstance(ip, str) else ip
    except ValueError as exc:
        raise RefusedURL(f"not an IP address {ip!r}") from exc
    if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id:
        raise RefusedURL(f"zone identifier in address {addr}")
    if isinstance(addr, ipaddress.IPv4Address):
        _check_v4(addr, shown=str(addr))
    else:
        _check_v6(addr)


def host_allowed(host: str, port: int, allow_hosts: list[str] | tuple[str, ...]) -> bool:
    """``host`` matches an entry for any port, ``host:port`` (or ``[v6]:port``) that port only."""
    host = _bare(host)
    for entry in allow_hosts:
        name, entry_port = _split_allow_entry(entry)
        if name == host and (entry_port is None or entry_port == port):
            return True
    return False


def _split_allow_entry(entry: str) -> tuple[str, int | None]:
    entry = entry.strip().lower()
    if "://" in entry:  # tolerate "https://host:port/..." written by an operator
        entry = entry.split("://", 1)[1]
    entry = entry.split("/", 1)[0]
    if entry.startswith("["):
        name, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif entry.count(":") == 1:
        name, _, port = entry.partition(":")
    else:  # bare name, IPv4 or unbracketed IPv6
        name, port = entry, ""
    return _bare(name), int(port) if port.isdigit() else None


def _bare(host: str) -> str:
    host = host.strip().lower().rstrip(".")
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _literal_ip(host: str) -> IPAddress | None:
    if "%" in host and ":" in host:
        raise RefusedURL(f"zone identifier in address {host}")
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _check_name_shape(host: str) -> None:
    name = host.rstrip(".")
    labels = name.split(".")
    if labels and _NUMERIC_LABEL.match(labels[-1]):
        # WHATWG parsers read any name whose last label is numeric as an IPv4 address
        # (127.1, 0x7f.1, 2130706433, 0177.0.0.1); resolvers disagree, so none is allowed.
        raise RefusedURL(f"legacy IPv4 form {host}")
    if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
        raise RefusedURL(f"invalid host name {host}")


def _check_public_name(host: str) -> None:
    name = host.rstrip(".")
    for suffix in INTERNAL_SUFFIXES:
        if name == suffix or name.endswith("." + suffix):
            raise RefusedURL(f"internal name {name}")
    if "." not in name:
        raise RefusedURL(f"single-label host name {name}")


def _check_v4(addr: ipaddress.IPv4Address, *, shown: str) -> None:
    for net, kind in IPV4_RULES:
        if addr in net:
            raise RefusedURL(f"{_address_phrase(kind)} {shown}")
    if not addr.is_global:  # registry additions after this table was written
        raise RefusedURL(f"non-public address {shown}")


def _check_v6(addr: ipaddress.IPv6Address) -> None:
    shown = str(addr)
    embedded = _embedded_v4(addr)
    if embedded is not None:
        kind, v4 = embedded
        _check_v4(v4, shown=f"{v4} ({kind} {shown})")
        if kind == "IPv4-compatible":  # deprecated form, never routable on its own
            raise RefusedURL(f"deprecated IPv4-compatible address {shown}")
        return
    for net, rule in IPV6_RULES:
        if addr in net:
            raise RefusedURL(f"{_address_phrase(rule)} {shown}")
    if addr not in _GLOBAL_UNICAST:
        raise RefusedURL(f"reserved address {shown}")
    if not addr.is_global:
        raise RefusedURL(f"non-public address {shown}")


def _embedded_v4(addr: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    packed = int(addr)
    if addr in _MAPPED:
        return "IPv4-mapped", ipaddress.IPv4Address(packed & 0xFFFFFFFF)
    if addr in _TRANSLATED:
        return "IPv4-translated", ipaddress.IPv4Address(packed & 0xFFFFFFFF)
    if addr in _NAT64:
        return "NAT64", ipaddress.IPv4Address(packed & 0xFFFFFFFF)
    if addr in _SIX_TO_FOUR:
        return "6to4", ipaddress.IPv4Address((packed >> 80) & 0xFFFFFFFF)
    if addr in _TEREDO:
        # The Teredo client address is stored inverted in the low 32 bits; the server sits
        # in bits 32..63. Either one being internal makes the address unusable for us.
        server = ipaddress.IPv4Address((packed >> 64) & 0xFFFFFFFF)
        client = ipaddress.IPv4Address(~packed & 0xFFFFFFFF)
        for v4 in (client, server):
            if not _v4_public(v4):
                return "Teredo", v4
        return "Teredo", client
    if addr in _COMPATIBLE and packed > 1:
        return "IPv4-compatible", ipaddress.IPv4Address(packed & 0xFFFFFFFF)
    return None


def _v4_public(v4: ipaddress.IPv4Address) -> bool:
    try:
        _check_v4(v4, shown=str(v4))
    except RefusedURL:
        return False
    return True


def _address_phrase(kind: str) -> str:
    return f"{kind} address"


def _unparsable_reason(text: str, exc: Exception) -> str:
    try:
        netloc = urlsplit(text).netloc
    except ValueError:
        netloc = ""
    host = netloc.rpartition("@")[2].rsplit(":", 1)[0].lower() if netloc else ""
    labels = host.rstrip(".").split(".")
    if host and labels and _NUMERIC_LABEL.match(labels[-1]):
        return f"legacy IPv4 form {host}"
    return f"invalid URL: {exc}"
