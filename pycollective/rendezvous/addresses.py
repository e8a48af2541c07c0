"""Which address each server of a job binds: the one its peers dial, never every interface
unless asked.

Every listening socket pycollective opens (rank 0's coordination service, the tcp and grpc data
listeners, parameter-server tasks) binds through :func:`server_host`:

- ``PYCOLLECTIVE_IFNAME`` (or ``ifname=``) set: that interface's IPv4 address, or the address
  given; ``0.0.0.0`` (or ``::``) is how a user asks for every interface;
- else the local address on the route toward the address peers already use to find this job
  (the coordinator's, or the task's own address in the cluster spec): loopback when that is
  loopback, so a single-host job is never reachable from the network, and a host's own address
  when the job spans hosts.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from pycollective import config

from .cluster import is_loopback

ALL_INTERFACES = ("0.0.0.0", "::")
_SIOCGIFADDR = 0x8915


def interface_address(name: str) -> str:
    """``name`` when it is an IP address, else the IPv4 address of the interface so named.

    Raises:
        ValueError: Neither an address nor an interface with an IPv4 address on this host.
    """
    try:
        ipaddress.ip_address(name)
        return name
    except ValueError:
        pass
    try:
        import fcntl

        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name[:15].encode()))
        finally:
            s.close()
        return socket.inet_ntoa(packed[20:24])
    except OSError as exc:
        raise ValueError(
            f"PYCOLLECTIVE_IFNAME={name!r} is neither an address nor an interface "
            f"with an IPv4 address on this host ({exc})"
        ) from None


def local_address_toward(host: str) -> str:
    """This host's address on the route toward ``host``: the address under which ``host`` (and
    hosts beside it) reach this one. ``host`` itself when it is one of this host's addresses;
    loopback when it is loopback.

    Raises:
        ValueError: ``host`` does not resolve, or no route leads to it.
    """
    if is_loopback(host):
        return "::1" if _is_ipv6(host) else "127.0.0.1"
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)  # a datagram socket sends nothing here: this only picks a route
            return str(s.getsockname()[0])
    except OSError as exc:
        raise ValueError(
            f"cannot find this host's address toward {host!r} ({exc}): set PYCOLLECTIVE_IFNAME "
            "to the interface or address peers reach this host at"
        ) from None


def server_host(toward: str, ifname: str | None = None) -> str:
    """The address a server binds (see the module's docstring).

    Args:
        toward: The address peers use to find this job: the coordinator's address, or this
            task's own host in the cluster spec.
        ifname: Overrides ``PYCOLLECTIVE_IFNAME``.
    """
    name = ifname or config.text("PYCOLLECTIVE_IFNAME")
    if name:
        return interface_address(name)
    return local_address_toward(toward)


def dial_host(bound: str) -> str:
    """The address this host's own clients dial a server bound to ``bound`` at."""
    if bound == "0.0.0.0":
        return "127.0.0.1"
    if bound == "::":
        return "::1"
    return bound


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return host.startswith("[") or ":" in host
