"""Function calls as bake makes them: the stdlib, `try`/`can`, and user `function` blocks.

A stdlib function of the same name wins over a user function (bake loads the stdlib first and
ignores the block); where the stdlib function is newer than buildx 0.13.1 the releases disagree,
so the resolver refuses. go-cty refuses a null argument unless the parameter allows it, and a
user function's parameters do not.
"""

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from hcl2.rules import functions as FN

from rocm_assets.core.bake import features
from rocm_assets.core.bake.errors import BakeError, BakeLimitError, NeedsBuildx, Unfollowed
from rocm_assets.core.bake.evaluator import Evaluator
from rocm_assets.core.bake.functions import ALLOW_NULL, FUNCTIONS, UNSUPPORTED
from rocm_assets.core.bake.limits import LimitError, quote
from rocm_assets.core.bake.parse import Block, line_of
from rocm_assets.core.bake.stdlib_sets import TAKES_SETS
from rocm_assets.core.bake.values import CtySet, number, text

Value = Any


def _arity(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


_SIGNATURES = {name: _arity(fn) for name, fn in FUNCTIONS.items()}
_STDLIB = {*FUNCTIONS, *UNSUPPORTED, "try", "can"}


def call(ev: Evaluator, rule: FN.FunctionCallRule, scope: Mapping[str, Value]) -> Value:
    name = ".".join(i.serialize() for i in rule.identifiers)
    arg_rules = list(rule.arguments.arguments) if rule.arguments is not None else []
    user = ev.bake.functions.get(name)
    if user is not None and name in features.FUNCTIONS:
        raise Unfollowed(
            f"function {name!r} is a user function here and a stdlib function in buildx "
            f">= {'.'.join(map(str, features.FUNCTIONS[name]))}"
        )
    if name in ("try", "can"):
        return _try(ev, name, arg_rules, scope, rule)
    args = [ev.expr(a, scope) for a in arg_rules]
    if rule.arguments is not None and rule.arguments.has_ellipsis and args:
        last = args.pop()
        if not isinstance(last, list):
            raise ev.error(f"{name}(...): the expanded argument must be a list", rule)
        args.extend(last)
    if user is not None and name not in _STDLIB:
        return _user_function(ev, user, args, rule)
    fn = FUNCTIONS.get(name)
    if fn is None:
        if name in UNSUPPORTED:
            raise Unfollowed(f"function {name}(): {UNSUPPORTED[name]}")
        raise ev.error(f"unknown function {quote(name)}", rule)
    signature = _SIGNATURES[name]
    if signature is not None:
        try:
            signature.bind(*args)
        except TypeError:
            raise ev.error(f"{name}(): wrong number of arguments ({len(args)})", rule) from None
    if name not in TAKES_SETS and any(isinstance(a, CtySet) for a in args):
        raise Unfollowed(f"{name}() of a set")
    if name not in ALLOW_NULL and any(a is None for a in args):
        raise ev.error(f"{name}(): an argument must not be null", rule)
    try:
        result = fn(*args)
    except LimitError as exc:
        raise BakeLimitError(str(exc), path=ev.bake.path, line=line_of(rule)) from None
    except (ValueError, TypeError, ArithmeticError, LookupError, RecursionError) as exc:
        message = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        message = quote(message, 200)[1:-1]
        prefix = "" if message.startswith(f"{name}()") else f"{name}(): "
        raise ev.error(f"{prefix}{message}", rule) from None
    if isinstance(result, int) and not isinstance(result, bool):
        result = number(result)
    elif isinstance(result, str):
        result = text(result)
    return ev.built(result, rule)


def _try(ev: Evaluator, name: str, args: list[Any], scope: Mapping[str, Value], rule: Any) -> Value:
    for arg in args:
        try:
            value = ev.expr(arg, scope)
        except (BakeLimitError, NeedsBuildx):
            # Our limits are not bake's errors, and a refusal is not known to fail in bake.
            raise
        except BakeError:
            continue
        return True if name == "can" else value
    if name == "can":
        return False
    raise ev.error("try(): no argument could be evaluated", rule)


def _user_function(ev: Evaluator, block: Block, args: list[Value], rule: Any) -> Value:
    if block.name in ev.calls:
        cycle = " -> ".join([*ev.calls[ev.calls.index(block.name) :], block.name])
        raise ev.error(f"function cycle: {cycle}", rule)
    params = _param_names(ev, block, "params")
    variadic = _param_names(ev, block, "variadic_params")
    if len(args) < len(params) or (len(args) > len(params) and not variadic):
        raise ev.error(
            f"function {block.name!r} takes {len(params)} arguments, got {len(args)}", rule
        )
    if any(a is None for a in args):
        raise ev.error(f"function {block.name!r}: an argument must not be null", rule)
    local = dict(zip(params, args, strict=False))
    if variadic:
        local[variadic[0]] = args[len(params) :]
    result = block.attrs.get("result")
    if result is None:
        raise ev.error(f"function {block.name!r} has no result", line=block.line)
    ev.calls.append(block.name)
    try:
        with ev.nested(rule):
            return ev.expr(result.expression, local)
    finally:
        ev.calls.pop()


def check_functions(ev: Evaluator) -> None:
    """What bake checks of every function block, called or not: its params and the names its
    result refers to."""
    for block in ev.bake.functions.values():
        if block.name in _STDLIB:
            continue  # bake never loads it
        if "result" not in block.attrs:
            raise ev.error(f"function {block.name!r}: empty result not allowed", line=block.line)
        params = _param_names(ev, block, "params") + _param_names(ev, block, "variadic_params")
        rule = block.attrs["result"]
        names, called = features.names_used(rule.expression, ev.bake.heredocs)
        for name in called:
            if name not in _STDLIB and name not in ev.bake.functions:
                raise ev.error(f"function {quote(name)} does not exist", rule)
        for name in names:
            if name not in params and name != "target":
                ev.value(name, rule)


def _param_names(ev: Evaluator, block: Block, attr: str) -> list[str]:
    rule = block.attrs.get(attr)
    if rule is None:
        if attr == "params":
            raise ev.error(f"function {block.name!r}: empty params not allowed", line=block.line)
        return []
    value = rule.expression.serialize()
    # params is a list of names; variadic_params one bare name (bake refuses `[rest]`).
    if attr == "variadic_params" and isinstance(value, list):
        raise ev.error(
            f"function {block.name!r}: variadic_params must be one name, not a list", rule
        )
    names = [str(v) for v in value] if isinstance(value, list) else [str(value)]
    if attr == "params" and not isinstance(value, list):
        raise ev.error(f"function {block.name!r}: params must be a list of names", rule)
    for name in names:
        if not name.replace("_", "a").replace("-", "a").isalnum() or name[0].isdigit():
            raise ev.error(
                f"function {block.name!r}: each of {attr} must be a name, not {quote(name)}", rule
            )
    return names
