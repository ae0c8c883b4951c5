from __future__ import annotations

import ipaddress

import pytest

from apiserver.images.fetch_guard import BlockedDestination, FetchPolicy, is_public


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1", "127.8.9.10", "0.0.0.0", "10.1.2.3", "172.16.0.1", "192.168.0.1", "169.254.169.254",
        "100.64.0.1", "192.0.2.1", "198.18.0.1", "224.0.0.1", "255.255.255.255", "240.0.0.1",
        "::1", "::", "fe80::1", "fd00:ec2::254", "fc00::1", "ff02::1", "2001:db8::1",
        "::ffff:127.0.0.1", "::ffff:10.0.0.1", "2002:7f00:1::", "2002:a9fe:a9fe::", "64:ff9b::a9fe:a9fe",
    ],
)  # fmt: skip
def test_loopback_private_link_local_and_reserved_addresses_are_not_public(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address",
    [
        # IPv4-mapped (::ffff:0:0/96).
        "::ffff:127.0.0.1", "::ffff:7f00:1", "::ffff:169.254.169.254", "::ffff:192.168.1.1",
        # IPv4-compatible (::/96, deprecated): Python's ipaddress calls these global.
        "::127.0.0.1", "::7f00:1", "::169.254.169.254", "::10.0.0.1", "::100.64.0.1",
        # NAT64, well-known prefix (64:ff9b::/96).
        "64:ff9b::127.0.0.1", "64:ff9b::169.254.169.254", "64:ff9b::172.16.0.1",
        # 6to4 (2002::/16): the IPv4 address is bits 16-47.
        "2002:7f00:1::1", "2002:a9fe:a9fe:1::1", "2002:c0a8:101::",
    ],
)  # fmt: skip
def test_ipv6_forms_embedding_a_loopback_private_or_metadata_ipv4_address_are_not_public(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))
    with pytest.raises(BlockedDestination, match="not a public address"):
        FetchPolicy().check_addresses("rebound.example.com", [address])


@pytest.mark.parametrize(
    "address",
    [
        # Local-use NAT64 (64:ff9b:1::/48), wherever the IPv4 address sits and whatever it is.
        "64:ff9b:1::7f00:1", "64:ff9b:1:7f00:1::", "64:ff9b:1::808:808", "64:ff9b:1:808:8:800::",
        # Teredo (2001::/32), whatever server and client it names.
        "2001:0:4136:e378:8000:63bf:80ff:fffe", "2001:0:808:808::f7f7:f7f7", "2001:0:7f00:1::",
    ],
)  # fmt: skip
def test_local_use_nat64_and_teredo_are_never_public(address: str) -> None:
    assert not is_public(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address",
    [
        "93.184.216.34", "8.8.8.8", "2606:4700::1111",
        "::ffff:8.8.8.8", "::8.8.8.8", "64:ff9b::808:808", "2002:808:808::", "2002:808:808:1::1",
    ],
)  # fmt: skip
def test_public_addresses_and_ipv6_forms_embedding_a_public_ipv4_address_are(address: str) -> None:
    assert is_public(ipaddress.ip_address(address))


def test_the_default_policy_takes_public_addresses_only() -> None:
    policy = FetchPolicy()
    policy.check_addresses("example.com", ["93.184.216.34", "2606:4700::1111"])
    with pytest.raises(BlockedDestination, match="not a public address"):
        policy.check_addresses("example.com", ["93.184.216.34", "10.0.0.1"])
    # The address a name resolved to is not told to the client.
    with pytest.raises(BlockedDestination) as caught:
        policy.check_addresses("intranet.example.com", ["10.9.8.7"])
    assert "10.9.8.7" not in str(caught.value)


def test_allow_private_takes_any_address() -> None:
    FetchPolicy(allow_private=True).check_addresses("localhost", ["127.0.0.1", "::1", "fe80::1%eth0"])


def test_allowed_domains_match_whole_host_names_in_any_case() -> None:
    policy = FetchPolicy(allowed_domains=["images.example.com"])
    policy.check_host("images.example.com")
    policy.check_host("IMAGES.example.com.")
    for host in ("example.com", "evil-images.example.com", "images.example.com.evil.net", "sub.images.example.com"):
        with pytest.raises(BlockedDestination, match="is not one this server fetches images from"):
            policy.check_host(host)
    FetchPolicy().check_host("anything.example.org")
