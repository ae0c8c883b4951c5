from __future__ import annotations

import ipaddress

import pytest

from apiserver.fetch_guard import BlockedDestination, FetchPolicy, is_public


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
    "address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "2002:808:808::", "64:ff9b::808:808"]
)
def test_public_addresses_are(address: str) -> None:
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
