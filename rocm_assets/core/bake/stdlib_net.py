"""bake's CIDR functions (hashicorp/go-cty-funcs cidr), for IPv4 prefixes.

An IPv6 prefix is refused: Go and Python write some IPv6 addresses differently.
"""

import ipaddress
from typing import Any

from rocm_assets.core.bake.errors import Unfollowed
from rocm_assets.core.bake.limits import quote
from rocm_assets.core.bake.values import to_int, to_string

Value = Any


def _cidr(prefix: Value) -> ipaddress.IPv4Network:
    text = to_string(prefix)
    try:
        net = ipaddress.ip_network(text, strict=False) if "/" in text else None
    except ValueError:
        net = None
    if net is None:
        raise ValueError(f"invalid CIDR expression: {quote(text)}")
    if not isinstance(net, ipaddress.IPv4Network):
        raise Unfollowed("a CIDR function of an IPv6 prefix")
    return net


def _cidrhost(prefix: Value, hostnum: Value) -> str:
    net, n = _cidr(prefix), to_int(hostnum, "cidrhost()'s host number")
    if not -net.num_addresses <= n < net.num_addresses:
        raise ValueError(f"cidrhost(): prefix has no host number {n}")
    return str(net[n])


def _cidrsubnet(prefix: Value, newbits: Value, netnum: Value) -> str:
    net = _cidr(prefix)
    bits, num = to_int(newbits, "cidrsubnet()'s newbits"), to_int(netnum, "cidrsubnet()'s netnum")
    if not 0 <= bits <= net.max_prefixlen - net.prefixlen or not 0 <= num < (1 << bits):
        raise ValueError("cidrsubnet(): newbits or netnum out of range for the prefix")
    size = 1 << (net.max_prefixlen - net.prefixlen - bits)
    first = int(net.network_address) + num * size
    return str(ipaddress.ip_network((first, net.prefixlen + bits)))


def _cidrsubnets(prefix: Value, *newbits: Value) -> list:
    net = _cidr(prefix)
    out, cursor = [], int(net.network_address)
    for bits in (to_int(b, "cidrsubnets()'s newbits") for b in newbits):
        length = net.prefixlen + bits
        if not net.prefixlen <= length <= net.max_prefixlen:
            raise ValueError("cidrsubnets(): newbits out of range for the prefix")
        size = 1 << (net.max_prefixlen - length)
        cursor = (cursor + size - 1) // size * size
        subnet = ipaddress.ip_network((cursor, length))
        if not subnet.subnet_of(net):
            raise ValueError("cidrsubnets(): not enough room in the prefix")
        out.append(str(subnet))
        cursor += size
    return out


NET_FUNCTIONS = {
    "cidrhost": _cidrhost,
    "cidrnetmask": lambda p: str(_cidr(p).netmask),
    "cidrsubnet": _cidrsubnet,
    "cidrsubnets": _cidrsubnets,
}
