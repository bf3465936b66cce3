"""Tier (b): the address a host advertises is one its peers can reach, never a wildcard."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from p2p.advertise import choose_advertise_host
from p2p.errors import AddressError
from p2p_helpers import host_config, start
from protocol.addresses import is_wildcard_host


def test_the_choice_in_order() -> None:
    assert choose_advertise_host("0.0.0.0", "203.0.113.7", ()).host == "203.0.113.7"
    assert choose_advertise_host("10.1.2.3", "", ()).host == "10.1.2.3"
    towards = choose_advertise_host("0.0.0.0", "", ("127.0.0.1:7000",))
    assert towards.host == "127.0.0.1" and "bootstrap peer 127.0.0.1:7000" in towards.why
    with pytest.raises(AddressError, match="wildcard"):
        choose_advertise_host("0.0.0.0", "0.0.0.0", ())


def test_without_peers_a_wildcard_listener_advertises_an_interface_or_asks_for_advertise() -> None:
    try:
        chosen = choose_advertise_host("0.0.0.0", "", ("no-such-host.invalid:7000",))
    except AddressError as exc:  # a host with several addresses must be told
        assert exc.what == "advertise" and "--advertise" in str(exc)
    else:
        assert not is_wildcard_host(chosen.host)


async def test_a_host_listening_on_every_interface_advertises_a_dialable_address(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            seed = await start(nursery, host_config(tmp_path, "seed"))
            wide = await start(nursery, host_config(tmp_path, "wide", bootstrap=(seed.gossip_addr,),
                                                   listen_host="0.0.0.0"))
            assert wide.gossip_addr.startswith("127.0.0.1:") and wide.http_addr.startswith("127.0.0.1:")
            nursery.cancel_scope.cancel()
