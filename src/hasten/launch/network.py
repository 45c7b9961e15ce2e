"""Which network interface reaches the main process (for GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME).

gloo advertises the address this machine's hostname resolves to, often
127.0.0.1; the other machines then connect to themselves and wait forever.
Naming the interface that routes to the main process's address avoids it.
The parsing is pure and tested; the `ip` command supplies the facts.
"""

from __future__ import annotations

import ipaddress
import socket
import subprocess

__all__ = ["is_loopback", "interface_for_address", "local_address_for", "owns_address", "parse_owner_interface",
           "parse_route_interface", "parse_route_source"]


def is_loopback(address: str) -> bool:
    """True for 127.0.0.0/8, ::1 and 'localhost'.

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("10.0.0.2")
        (True, False)
    """
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def parse_owner_interface(ip_addr_output: str, address: str) -> str | None:
    """The interface that owns `address`, from `ip -o addr show` output.

    Example:
        >>> parse_owner_interface("2: veth0    inet 10.9.0.1/24 brd 10.9.0.255 scope global veth0", "10.9.0.1")
        'veth0'
    """
    for line in ip_addr_output.splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("inet", "inet6") and parts[3].split("/")[0] == address:
            return parts[1].rstrip(":").split("@")[0]
    return None


def parse_route_interface(ip_route_output: str) -> str | None:
    """The `dev` of `ip route get ADDRESS` output.

    Example:
        >>> parse_route_interface("10.9.0.2 dev veth1 src 10.9.0.1 uid 0")
        'veth1'
    """
    return _route_field(ip_route_output, "dev")


def parse_route_source(ip_route_output: str) -> str | None:
    """The `src` of `ip route get ADDRESS` output: this machine's address on the way there.

    Example:
        >>> parse_route_source("10.9.0.2 dev veth1 src 10.9.0.1 uid 0")
        '10.9.0.1'
    """
    return _route_field(ip_route_output, "src")


def _route_field(ip_route_output: str, key: str) -> str | None:
    """The word after `key` in `ip route get` output (None when it is not there)."""
    parts = ip_route_output.split()
    if key in parts and parts.index(key) + 1 < len(parts):
        return parts[parts.index(key) + 1]
    return None


def _run(*argv: str) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def interface_for_address(address: str) -> str | None:
    """The local interface to use for reaching `address` (None if it cannot be told).

    If `address` is this machine's own, the interface that carries it;
    otherwise the interface of the route to it.
    """
    try:
        address = socket.gethostbyname(address)
    except OSError:
        return None
    owner = parse_owner_interface(_run("ip", "-o", "addr", "show"), address)
    if owner and owner != "lo":
        return owner
    route = parse_route_interface(_run("ip", "route", "get", address))
    return route if route != "lo" else None


def owns_address(address: str) -> bool:
    """True when this machine carries `address` on one of its interfaces (loopback addresses included).

    Example:
        >>> owns_address("127.0.0.1")
        True
    """
    if is_loopback(address):
        return True
    try:
        address = socket.gethostbyname(address)
    except OSError:
        return False
    return parse_owner_interface(_run("ip", "-o", "addr", "show"), address) is not None


def local_address_for(address: str) -> str | None:
    """This machine's address that `address` can reach it at (None if it cannot be told).

    `address` itself when this machine owns it; otherwise the source address
    of the route to it. torch's elastic agent advertises this address to the
    others (its hostname may resolve to a loopback or unreachable address).
    """
    try:
        address = socket.gethostbyname(address)
    except OSError:
        return None
    if owns_address(address):
        return address
    return parse_route_source(_run("ip", "route", "get", address))
