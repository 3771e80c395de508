"""The outbound URL policy: every hostile form is refused and the reason names the rule."""

from __future__ import annotations

import re

import pytest

from delivery.net.urlsafety import RefusedURL, check_ip, check_url, host_allowed

HOSTILE = [
    # scheme
    ("http://example.com/a.png", "scheme http is not allowed"),
    ("ftp://example.com/a.png", "scheme ftp is not allowed"),
    ("file:///etc/passwd", "scheme file is not allowed"),
    ("gopher://example.com:70/_x", "scheme gopher is not allowed"),
    ("javascript:alert(1)", "scheme javascript is not allowed"),
    ("data:image/png;base64,AAAA", "scheme data is not allowed"),
    ("//example.com/a.png", "scheme (none) is not allowed"),
    # userinfo and parser tricks
    ("https://user:pw@example.com/a.png", "userinfo in URL"),
    ("https://example.com@127.0.0.1/", "userinfo in URL"),
    ("https://evil.com\\@127.0.0.1/", "userinfo in URL"),
    ("https://exa\tmple.com/", "control character in URL"),
    ("https://example.com\n.internal/", "control character in URL"),
    ("https://ex ample.com/", "space in host"),
    ("https:///a.png", "missing host"),
    ("https://example.com:0/", "invalid port 0"),
    ("https://a]b.com/", "invalid URL"),
    ("https://[::1/", "invalid URL"),
    ("https://example.com:99999/", "invalid port 99999"),
    ("https://127。0。0。1/", "loopback address 127.0.0.1"),
    ("https://exa%6dple.com/", "invalid host name exa%6dple.com"),
    # internal and single-label names
    ("https://localhost/", "internal name localhost"),
    ("https://api.localhost/", "internal name api.localhost"),
    ("https://printer.local/", "internal name printer.local"),
    ("https://db.internal/", "internal name db.internal"),
    (
        "https://metadata.google.internal/computeMetadata/v1/",
        "internal name metadata.google.internal",
    ),
    ("https://metadata.goog/", "internal name metadata.goog"),
    ("https://router.home.arpa/", "internal name router.home.arpa"),
    ("https://fileserver/", "single-label host name fileserver"),
    ("https://intranet/", "internal name intranet"),
    ("https://metadata/", "single-label host name metadata"),
    # legacy IPv4 forms
    ("https://0x7f.1/", "legacy IPv4 form 0x7f.1"),
    ("https://0x7f000001/", "legacy IPv4 form 0x7f000001"),
    ("https://2130706433/", "legacy IPv4 form 2130706433"),
    ("https://0177.0.0.1/", "legacy IPv4 form 0177.0.0.1"),
    ("https://127.1/", "legacy IPv4 form 127.1"),
    ("https://10.1/", "legacy IPv4 form 10.1"),
    ("https://1.2.3.4.5/", "legacy IPv4 form 1.2.3.4.5"),
    # IPv4 ranges
    ("https://0.0.0.0/", "unspecified address 0.0.0.0"),
    ("https://0.1.2.3/", "this-network address 0.1.2.3"),
    ("https://255.255.255.255/", "broadcast address 255.255.255.255"),
    ("https://224.0.0.1/", "multicast address 224.0.0.1"),
    ("https://169.254.169.254/latest/meta-data/", "cloud metadata address 169.254.169.254"),
    ("https://169.254.10.1/", "link-local address 169.254.10.1"),
    ("https://127.0.0.1/", "loopback address 127.0.0.1"),
    ("https://127.255.0.9:8443/", "loopback address 127.255.0.9"),
    ("https://100.64.0.1/", "shared (CGNAT) address 100.64.0.1"),
    ("https://100.100.100.200/", "cloud metadata address 100.100.100.200"),
    ("https://10.0.0.1/", "private address 10.0.0.1"),
    ("https://172.16.5.4/", "private address 172.16.5.4"),
    ("https://192.168.1.1/", "private address 192.168.1.1"),
    ("https://240.0.0.1/", "reserved address 240.0.0.1"),
    ("https://198.18.0.1/", "benchmarking address 198.18.0.1"),
    ("https://192.0.2.1/", "documentation (TEST-NET-1) address 192.0.2.1"),
    ("https://198.51.100.7/", "documentation (TEST-NET-2) address 198.51.100.7"),
    ("https://203.0.113.9/", "documentation (TEST-NET-3) address 203.0.113.9"),
    ("https://192.0.0.8/", "IETF protocol address 192.0.0.8"),
    # IPv6 ranges
    ("https://[::]/", "unspecified address ::"),
    ("https://[::1]/", "loopback address ::1"),
    ("https://[fe80::1]/", "link-local address fe80::1"),
    ("https://[fe80::1%25eth0]/", "zone identifier in address"),
    ("https://[fc00::1]/", "unique-local address fc00::1"),
    ("https://[fd12:3456::1]/", "unique-local address fd12:3456::1"),
    ("https://[fd00:ec2::254]/", "cloud metadata address fd00:ec2::254"),
    ("https://[ff02::1]/", "multicast address ff02::1"),
    ("https://[fec0::1]/", "site-local address fec0::1"),
    ("https://[2001:db8::1]/", "documentation address 2001:db8::1"),
    ("https://[100::1]/", "discard-only address 100::1"),
    ("https://[4000::1]/", "reserved address 4000::1"),
    # IPv4 hidden inside IPv6
    ("https://[::ffff:127.0.0.1]/", "loopback address 127.0.0.1 (IPv4-mapped"),
    ("https://[::ffff:a9fe:a9fe]/", "cloud metadata address 169.254.169.254 (IPv4-mapped"),
    ("https://[::ffff:10.0.0.1]/", "private address 10.0.0.1 (IPv4-mapped"),
    ("https://[64:ff9b::10.0.0.1]/", "private address 10.0.0.1 (NAT64"),
    ("https://[64:ff9b::7f00:1]/", "loopback address 127.0.0.1 (NAT64"),
    ("https://[64:ff9b:1::1]/", "local-use NAT64 address 64:ff9b:1::1"),
    ("https://[2002:7f00:1::]/", "loopback address 127.0.0.1 (6to4"),
    ("https://[2002:c0a8:101::1]/", "private address 192.168.1.1 (6to4"),
    ("https://[2001:0:4136:e378:8000:63bf:80ff:fffe]/", "loopback address 127.0.0.1 (Teredo"),
    ("https://[::127.0.0.1]/", "loopback address 127.0.0.1 (IPv4-compatible"),
    ("https://[::8.8.8.8]/", "deprecated IPv4-compatible address ::808:808"),
]


@pytest.mark.parametrize(("url", "reason"), HOSTILE, ids=[u for u, _ in HOSTILE])
def test_hostile_url_is_refused_with_its_rule(url: str, reason: str) -> None:
    with pytest.raises(RefusedURL) as info:
        check_url(url, [])
    assert reason in info.value.reason
    assert str(info.value) == info.value.reason


def test_corpus_is_large_and_distinct() -> None:
    urls = [u for u, _ in HOSTILE]
    assert len(urls) >= 40
    assert len(set(urls)) == len(urls)


@pytest.mark.parametrize(
    ("url", "host", "port"),
    [
        ("https://example.com/a.png", "example.com", 443),
        ("HTTPS://CDN.Example.COM:8443/x?y=1", "cdn.example.com", 8443),
        ("https://example.com./trailing-dot", "example.com.", 443),
        ("https://1.1.1.1/x", "1.1.1.1", 443),
        ("https://[2606:4700:4700::1111]/x", "2606:4700:4700::1111", 443),
        ("https://[::ffff:8.8.8.8]/", "::ffff:8.8.8.8", 443),
        ("https://[2002:808:808::1]/", "2002:808:808::1", 443),
        ("https://пример.рф/файл.png", "xn--e1afmkfd.xn--p1ai", 443),
        ("https://oss.example.com/my file.png", "oss.example.com", 443),
        ("https://a_b.example.com/", "a_b.example.com", 443),
    ],
)
def test_public_urls_pass(url: str, host: str, port: int) -> None:
    target = check_url(url, [])
    assert (target.host, target.port, target.allow_listed) == (host, port, False)


def test_allow_list_exempts_scheme_and_private_rules_for_that_host_only() -> None:
    target = check_url("http://127.0.0.1:8080/a.png", ["127.0.0.1:8080"])
    assert target.allow_listed and str(target.ip) == "127.0.0.1"
    with pytest.raises(RefusedURL, match=re.escape("scheme http is not allowed")):
        check_url("http://127.0.0.1:8081/a.png", ["127.0.0.1:8080"])
    with pytest.raises(RefusedURL, match=re.escape("loopback address 127.0.0.1")):
        check_url("https://127.0.0.1:8081/a.png", ["127.0.0.1:8080"])
    with pytest.raises(RefusedURL, match=re.escape("private address 10.0.0.1")):
        check_url("https://10.0.0.1/", ["127.0.0.1"])
    # a bare host is allowed on every port; names too
    assert check_url("http://localhost:9/x", ["LOCALHOST"]).allow_listed
    assert check_url("https://minio.internal:9000/b/k", ["minio.internal"]).allow_listed
    assert check_url("http://[::1]:8080/", ["[::1]:8080"]).allow_listed
    assert check_url("http://[::1]:8080/", ["::1"]).allow_listed


def test_allow_list_never_exempts_userinfo_or_legacy_forms() -> None:
    with pytest.raises(RefusedURL, match=re.escape("userinfo in URL")):
        check_url("http://u:p@127.0.0.1:8080/", ["127.0.0.1"])
    with pytest.raises(RefusedURL, match=re.escape("legacy IPv4 form 127.1")):
        check_url("http://127.1:8080/", ["127.1"])
    with pytest.raises(RefusedURL, match=re.escape("scheme file is not allowed")):
        check_url("file:///etc/passwd", ["127.0.0.1"])


@pytest.mark.parametrize(
    ("entry", "host", "port", "expected"),
    [
        ("example.com", "example.com", 1, True),
        ("example.com:443", "example.com", 443, True),
        ("example.com:443", "example.com", 444, False),
        ("Example.COM.", "example.com", 443, True),
        ("[::1]:80", "::1", 80, True),
        ("other.com", "example.com", 443, False),
        ("https://example.com:8443/path", "example.com", 8443, True),
        ("http://[::1]:8080", "::1", 8080, True),
    ],
)
def test_host_allowed(entry: str, host: str, port: int, expected: bool) -> None:
    assert host_allowed(host, port, [entry]) is expected


@pytest.mark.parametrize(
    ("ip", "reason"),
    [
        ("10.1.2.3", "private address 10.1.2.3"),
        ("::ffff:192.168.0.1", "private address 192.168.0.1"),
        ("fe80::1%eth0", "zone identifier"),
        ("not-an-ip", "not an IP address"),
    ],
)
def test_check_ip_refuses(ip: str, reason: str) -> None:
    with pytest.raises(RefusedURL, match=reason):
        check_ip(ip)


@pytest.mark.parametrize("ip", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.4.4"])
def test_check_ip_accepts_public(ip: str) -> None:
    assert check_ip(ip) is None
