"""Evaluate a parsed bake file the way `docker buildx bake` does.

python-hcl2 has no expression evaluator, so this one walks its typed tree. It covers what bake
files need: variables (defaults, env overrides typed as bake types them, validation), top-level
attributes (bake's stand-in for locals, and overrides of a variable's default), user functions,
interpolation and template directives, heredocs, conditionals, operators, object/tuple literals,
for expressions, indexing, splats and `target.<name>.<attr>` references. Targets, groups and
matrices are in `blocks`.

Every evaluation runs on a `Budget` (see `limits`): nesting, steps, string and collection sizes
are bounded, and any error is a one-line BakeError naming the file and line.
"""

import contextlib
import functools
import inspect
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from hcl2.rules import (
    base as B,
    containers as C,
    directives as D,
    expressions as E,
    for_expressions as FE,
    functions as FN,
    indexing as IX,
    literal_rules as L,
    strings as S,
)

from rocm_assets.core.bake import blocks, templates
from rocm_assets.core.bake.errors import BakeError, BakeLimitError
from rocm_assets.core.bake.functions import FUNCTIONS, UNSUPPORTED
from rocm_assets.core.bake.limits import MAX_DEPTH, Budget, LimitError, quote
from rocm_assets.core.bake.parse import BakeFile, Block, line_of
from rocm_assets.core.bake.values import (
    PARSE_BOOL_FALSE,
    PARSE_BOOL_TRUE,
    equal,
    number,
    parse_number,
    to_bool,
    to_int,
    to_number,
    to_string,
    type_name,
)

Value = Any

_BUILTINS = {"BAKE_CMD_CONTEXT": "cwd://", "BAKE_LOCAL_PLATFORM": "linux/amd64"}
# What Python raises for a bad operand deep in an operation: turned into a BakeError with the
# line of the expression that caused it.
_OPERAND_ERRORS = (ValueError, TypeError, ArithmeticError, LookupError)


def _arity(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


_SIGNATURES = {name: _arity(fn) for name, fn in FUNCTIONS.items()}


class Evaluation:
    """Values of one bake file under one environment, computed lazily and memoised."""

    def __init__(self, bake: BakeFile, env: Mapping[str, str], budget: Budget | None = None):
        self.bake = bake
        self.env = env
        self.budget = budget or Budget()
        self.depth = 0
        self._values: dict[str, Value] = {}
        self._stack: list[str] = []
        self._calls: list[str] = []

    # ---- errors and bounds ----
    def error(self, message: str, rule: Any = None, line: int | None = None) -> BakeError:
        return BakeError(
            message, path=self.bake.path, line=line or (line_of(rule) if rule else None)
        )

    @contextlib.contextmanager
    def nested(self, rule: Any = None, line: int | None = None) -> Iterator[None]:
        """One level deeper: an expression, a reference, a call or an inherited target."""
        self.depth += 1
        self.budget.deepest = max(self.budget.deepest, self.depth)
        try:
            if self.depth > MAX_DEPTH:
                raise BakeLimitError(
                    f"expressions, references and calls nest deeper than the limit of {MAX_DEPTH}",
                    path=self.bake.path,
                    line=line or (line_of(rule) if rule else None),
                )
            yield
        finally:
            self.depth -= 1

    @contextlib.contextmanager
    def limits(self, rule: Any = None, line: int | None = None) -> Iterator[None]:
        """A limit reached inside is reported as a BakeLimitError at `rule`'s line."""
        try:
            yield
        except LimitError as exc:
            raise BakeLimitError(
                str(exc), path=self.bake.path, line=line or (line_of(rule) if rule else None)
            ) from None

    def built(self, value: Value, rule: Any) -> Value:
        """Charge the budget for a value made at `rule`, and check its size and nesting."""
        with self.limits(rule):
            return self.budget.built(value)

    # ---- named values ----
    def names(self) -> list[str]:
        return list(dict.fromkeys([*self.bake.variables, *self.bake.attrs]))

    def value(self, name: str, rule: Any = None) -> Value:
        if name in self._values:
            return self._values[name]
        if name in self._stack:
            cycle = " -> ".join([*self._stack[self._stack.index(name) :], name])
            raise self.error(f"variable cycle: {cycle}", rule)
        self._stack.append(name)
        try:
            if name in self.bake.variables:
                result = self._variable(self.bake.variables[name])
            elif name in self.bake.attrs:
                result = self.expr(self.bake.attrs[name].expression, {})
            elif name in _BUILTINS:
                result = _BUILTINS[name]
            else:
                raise self.error(
                    f"unknown variable {quote(name)}: no variable block or top-level attribute "
                    "declares it",
                    rule,
                )
        finally:
            self._stack.pop()
        self._values[name] = result
        return result

    def _variable(self, block: Block) -> Value:
        # As bake's resolveValue: a top-level attribute of the same name replaces the default;
        # the environment overrides either.
        attr = self.bake.attrs.get(block.name)
        default_rule = attr or block.attrs.get("default")
        type_rule = block.attrs.get("type")
        default = self.expr(default_rule.expression, {}) if default_rule else None
        declared = self._declared_type(type_rule) if type_rule else None
        if block.name in self.env:
            raw = self.env[block.name]
            kind = declared or (type_name(default) if default is not None else "string")
            typed = self._typed(block, raw, kind)
            with self.limits(line=block.line):
                return self.budget.built(typed)
        if default_rule is None:
            # bake: an untyped variable without default is "", a typed one null.
            return None if declared else ""
        return default

    def _declared_type(self, rule: B.AttributeRule) -> str:
        text = rule.expression.serialize()
        text = text[2:-1] if isinstance(text, str) and text.startswith("${") else str(text)
        return text.split("(", 1)[0].strip()

    def _typed(self, block: Block, raw: str, kind: str) -> Value:
        """Convert an env override the way bake's convertPrimitive does."""
        if kind == "bool":
            if raw in PARSE_BOOL_TRUE:
                return True
            if raw in PARSE_BOOL_FALSE:
                return False
            raise self.error(f"failed to parse {block.name} as bool: {quote(raw)}", line=block.line)
        if kind == "number":
            try:
                return parse_number(raw)
            except ValueError:
                raise self.error(
                    f"failed to parse {block.name} as number: {quote(raw)}", line=block.line
                ) from None
        if kind in ("list", "set", "tuple"):
            return [item for item in raw.split(",") if item] if raw else []
        if kind in ("string", "any"):
            return raw
        raise self.error(
            f"variable {block.name}: an env override of a {kind} needs an explicit type",
            line=block.line,
        )

    def validate(self) -> None:
        """Run every variable's validation blocks, as bake does once all values are known."""
        for block in self.bake.variables.values():
            for rule in block.blocks:
                attrs = {
                    c.identifier.serialize(): c
                    for c in rule.body.children
                    if isinstance(c, B.AttributeRule)
                }
                condition = attrs.get("condition")
                if condition is None:
                    raise self.error(f"variable {block.name}: validation has no condition", rule)
                if not self.truth(self.expr(condition.expression, {}), condition):
                    message = attrs.get("error_message")
                    text = (
                        to_string(self.expr(message.expression, {}))
                        if message
                        else "validation failed"
                    )
                    raise self.error(f"variable {block.name}: {quote(text, 200)[1:-1]}", condition)

    # ---- targets (see blocks) ----
    @functools.cached_property
    def expansion(self) -> blocks.Expansion:
        return blocks.expand(self)

    def target_attr(self, name: str, attr: str, rule: Any) -> Value:
        return blocks.target_attr(self, name, attr, rule)

    # ---- expressions ----
    def truth(self, value: Value, rule: Any) -> bool:
        try:
            return to_bool(value)
        except ValueError as exc:
            raise self.error(str(exc), rule) from None

    def expr(self, rule: Any, scope: Mapping[str, Value]) -> Value:
        # The hottest path of the evaluator: exact-type checks and a dispatch table, not a chain
        # of isinstance calls on python-hcl2's ABCs, and no context manager per expression.
        while type(rule) is E.ExprTermRule:
            rule = rule.expression
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise BakeLimitError(
                    f"expressions, references and calls nest deeper than the limit of {MAX_DEPTH}",
                    path=self.bake.path,
                    line=line_of(rule),
                )
            if self.depth > self.budget.deepest:
                self.budget.deepest = self.depth
            self.budget.spend()
            kind = self._KINDS.get(type(rule))
            if kind is None:
                raise self.error(f"unsupported expression {type(rule).__name__}", rule)
            return kind(self, rule, scope)
        except LimitError as exc:
            raise BakeLimitError(str(exc), path=self.bake.path, line=line_of(rule)) from None
        except _OPERAND_ERRORS as exc:
            raise self.error(quote(str(exc), 200)[1:-1], rule) from None
        finally:
            self.depth -= 1

    def _conditional(self, rule: E.ConditionalRule, scope: Mapping[str, Value]) -> Value:
        condition = self.truth(self.expr(rule.condition, scope), rule)
        return self.expr(rule.if_true if condition else rule.if_false, scope)

    def _unary(self, rule: E.UnaryOpRule, scope: Mapping[str, Value]) -> Value:
        value = self.expr(rule.expr_term, scope)
        if str(rule.operator) == "!":
            return not self.truth(value, rule)
        return number(-to_number(value))

    def _name(self, rule: L.IdentifierRule, scope: Mapping[str, Value]) -> Value:
        return self._identifier(rule.serialize(), rule, scope)

    def _number(self, rule: Any, scope: Mapping[str, Value]) -> Value:
        # python-hcl2 gives exponent floats back as text ("${1e3}"): read the token itself.
        token = rule.token.value
        return number(token) if isinstance(token, int | float) else parse_number(str(token))

    def _literal(self, rule: L.LiteralValueRule, scope: Mapping[str, Value]) -> Value:
        return rule.serialize()  # python-hcl2 already maps true/false/null

    def _string(self, rule: S.StringRule, scope: Mapping[str, Value]) -> Value:
        return self.built(templates.template(self, rule.string_parts, scope), rule)

    def _heredoc(self, rule: Any, scope: Mapping[str, Value]) -> Value:
        return self.built(templates.heredoc(self, rule, scope), rule)

    def _directive(self, rule: Any, scope: Mapping[str, Value]) -> Value:
        return self.built(templates.template(self, [rule], scope), rule)

    def _tuple(self, rule: C.TupleRule, scope: Mapping[str, Value]) -> Value:
        # A loop, not a comprehension: in Python 3.11 that is one more frame per level.
        items = []
        for element in rule.elements:
            items.append(self.expr(element, scope))  # noqa: PERF401
        return self.built(items, rule)

    def _object(self, rule: C.ObjectRule, scope: Mapping[str, Value]) -> Value:
        obj = {}
        for element in rule.elements:
            obj[self._key(element.key, scope)] = self.expr(element.expression, scope)
        return self.built(obj, rule)

    def _index_rule(self, rule: IX.IndexExprTermRule, scope: Mapping[str, Value]) -> Value:
        target, index = rule.children
        return self._index(self.expr(target, scope), index, scope, rule)

    _ARITH: dict[str, Callable[[Any, Any], Any]] = {  # noqa: RUF012
        "+": operator.add,
        "-": operator.sub,
        "*": operator.mul,
        "/": operator.truediv,
        "%": operator.mod,
        "<": operator.lt,
        ">": operator.gt,
        "<=": operator.le,
        ">=": operator.ge,
    }

    def _binary(self, rule: E.BinaryOpRule, scope: Mapping[str, Value]) -> Value:
        op = str(rule.binary_term.binary_operator.serialize()).strip()
        left = self.expr(rule.expr_term, scope)
        if op in ("&&", "||"):
            lhs = self.truth(left, rule)
            if (op == "&&" and not lhs) or (op == "||" and lhs):
                return lhs
            return self.truth(self.expr(rule.binary_term.expr_term, scope), rule)
        right = self.expr(rule.binary_term.expr_term, scope)
        if op in ("==", "!="):
            # go-cty compares without conversion: a bool is never equal to the string "true".
            same = equal(left, right)
            return same if op == "==" else not same
        if op not in self._ARITH:
            raise self.error(f"unsupported operator {quote(op)}", rule)
        try:
            result = self._ARITH[op](to_number(left), to_number(right))
        except ZeroDivisionError:
            raise self.error("division by zero", rule) from None
        except OverflowError:
            raise self.error("number out of range (beyond about ±1.8e308)", rule) from None
        return result if isinstance(result, bool) else number(result)

    def _identifier(self, name: str, rule: Any, scope: Mapping[str, Value]) -> Value:
        if name in scope:
            return scope[name]
        if name == "target" and name not in self.bake.variables and name not in self.bake.attrs:
            raise self.error(
                "cannot access target as a value: write target.<name>.<attribute>", rule
            )
        return self.value(name, rule)

    def _is_target_namespace(self, rule: Any, scope: Mapping[str, Value]) -> bool:
        while isinstance(rule, E.ExprTermRule):
            rule = rule.expression
        return (
            isinstance(rule, L.IdentifierRule)
            and rule.serialize() == "target"
            and "target" not in scope
            and "target" not in self.bake.variables
            and "target" not in self.bake.attrs
        )

    def _getattr_rule(self, rule: IX.GetAttrExprTermRule, scope: Mapping[str, Value]) -> Value:
        attr = rule.get_attr.identifier.serialize()
        inner = rule.expr_term
        while isinstance(inner, E.ExprTermRule):
            inner = inner.expression
        if isinstance(inner, IX.GetAttrExprTermRule) and self._is_target_namespace(
            inner.expr_term, scope
        ):
            return self.target_attr(inner.get_attr.identifier.serialize(), attr, rule)
        if self._is_target_namespace(inner, scope):
            raise self.error(f"target.{attr} is a whole target: read one attribute of it", rule)
        return self._getattr(self.expr(rule.expr_term, scope), attr, rule)

    def _getattr(self, base: Value, name: str, rule: Any) -> Value:
        if isinstance(base, dict):
            if name not in base:
                raise self.error(f"object has no attribute {quote(name)}", rule)
            return base[name]
        raise self.error(f"cannot read .{name} of a {type_name(base)}", rule)

    def _index(self, base: Value, index_rule: Any, scope: Mapping[str, Value], rule: Any) -> Value:
        if isinstance(index_rule, IX.SqbIndexRule):
            key = self.expr(index_rule.index_expression, scope)
        else:
            key = (
                index_rule.index.serialize()
                if hasattr(index_rule.index, "serialize")
                else index_rule.index
            )
        if isinstance(base, list):
            i = to_int(key, "an index")
            if not 0 <= i < len(base):
                raise self.error(f"index {i} out of range for a list of {len(base)}", rule)
            return base[i]
        if isinstance(base, dict):
            key = to_string(key)
            if key not in base:
                raise self.error(f"no key {quote(key)} in object", rule)
            return base[key]
        raise self.error(f"cannot index a {type_name(base)}", rule)

    def _splat(self, rule: Any, scope: Mapping[str, Value]) -> Value:
        base = self.expr(rule.expr_term, scope)
        items = base if isinstance(base, list) else ([] if base is None else [base])
        out = []
        for item in items:
            value = item
            for get in rule.attr_splat.get_attrs:
                value = self._getattr(value, get.identifier.serialize(), rule)
            out.append(value)
        return self.built(out, rule)

    def _for(self, rule: Any, scope: Mapping[str, Value]) -> Value:
        intro = rule.for_intro
        collection = self.expr(intro.iterable, scope)
        if isinstance(collection, dict):
            pairs: list[tuple[Value, Value]] = list(collection.items())
        elif isinstance(collection, list):
            pairs = list(enumerate(collection))
        else:
            raise self.error(f"cannot iterate over a {type_name(collection)}", rule)
        first = intro.first_iterator.serialize()
        second = intro.second_iterator.serialize() if intro.second_iterator else None
        tuple_out: list[Value] = []
        object_out: dict[str, Value] = {}
        for key, item in pairs:
            local = {**scope, **({first: key, second: item} if second else {first: item})}
            if rule.condition is not None and not self.truth(
                self.expr(rule.condition.condition_expr, local), rule
            ):
                continue
            if isinstance(rule, FE.ForTupleExprRule):
                tuple_out.append(self.expr(rule.value_expr, local))
                continue
            k = to_string(self.expr(rule.key_expr, local))
            v = self.expr(rule.value_expr, local)
            if rule.ellipsis is not None:
                object_out.setdefault(k, []).append(v)
            elif k in object_out:
                raise self.error(f"duplicate key {quote(k)} in a for expression", rule)
            else:
                object_out[k] = v
        return self.built(tuple_out if isinstance(rule, FE.ForTupleExprRule) else object_out, rule)

    def _key(self, rule: Any, scope: Mapping[str, Value]) -> str:
        if isinstance(rule, C.ObjectElemKeyExpressionRule):
            return to_string(self.expr(rule.expression, scope))
        value = rule.value
        if isinstance(value, L.IdentifierRule):
            return value.serialize()
        if isinstance(value, S.StringRule):
            return to_string(templates.template(self, value.string_parts, scope))
        return to_string(self.expr(value, scope))

    # ---- function calls ----
    def _call(self, rule: FN.FunctionCallRule, scope: Mapping[str, Value]) -> Value:
        name = ".".join(i.serialize() for i in rule.identifiers)
        arg_rules = list(rule.arguments.arguments) if rule.arguments is not None else []
        if name in ("try", "can") and name not in self.bake.functions:
            return self._try(name, arg_rules, scope, rule)
        args = [self.expr(a, scope) for a in arg_rules]
        if rule.arguments is not None and rule.arguments.has_ellipsis and args:
            last = args.pop()
            if not isinstance(last, list):
                raise self.error(f"{name}(...): the expanded argument must be a list", rule)
            args.extend(last)
        if name in self.bake.functions:
            return self._user_function(self.bake.functions[name], args, rule)
        fn = FUNCTIONS.get(name)
        if fn is None:
            if name in UNSUPPORTED:
                raise self.error(
                    f"function {name!r} is not supported by rocm-assets: {UNSUPPORTED[name]}", rule
                )
            raise self.error(f"unknown function {quote(name)}", rule)
        signature = _SIGNATURES[name]
        if signature is not None:
            try:
                signature.bind(*args)
            except TypeError:
                raise self.error(
                    f"{name}(): wrong number of arguments ({len(args)})", rule
                ) from None
        try:
            result = fn(*args)
            if isinstance(result, int | float) and not isinstance(result, bool):
                result = number(result)
        except LimitError as exc:
            raise BakeLimitError(str(exc), path=self.bake.path, line=line_of(rule)) from None
        except (*_OPERAND_ERRORS, RecursionError) as exc:
            message = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            message = quote(message, 200)[1:-1]
            prefix = "" if message.startswith(f"{name}()") else f"{name}(): "
            raise self.error(f"{prefix}{message}", rule) from None
        return self.built(result, rule)

    def _try(self, name: str, args: list[Any], scope: Mapping[str, Value], rule: Any) -> Value:
        for arg in args:
            try:
                value = self.expr(arg, scope)
            except BakeLimitError:
                raise
            except BakeError:
                continue
            return True if name == "can" else value
        if name == "can":
            return False
        raise self.error("try(): no argument could be evaluated", rule)

    def _user_function(self, block: Block, args: list[Value], rule: Any) -> Value:
        if block.name in self._calls:
            cycle = " -> ".join([*self._calls[self._calls.index(block.name) :], block.name])
            raise self.error(f"function cycle: {cycle}", rule)
        params = self._param_names(block, "params")
        variadic = self._param_names(block, "variadic_params")
        if len(args) < len(params) or (len(args) > len(params) and not variadic):
            raise self.error(
                f"function {block.name!r} takes {len(params)} arguments, got {len(args)}", rule
            )
        local = dict(zip(params, args, strict=False))
        if variadic:
            local[variadic[0]] = args[len(params) :]
        result = block.attrs.get("result")
        if result is None:
            raise self.error(f"function {block.name!r} has no result", line=block.line)
        self._calls.append(block.name)
        try:
            with self.nested(rule):
                return self.expr(result.expression, local)
        finally:
            self._calls.pop()

    def _param_names(self, block: Block, attr: str) -> list[str]:
        rule = block.attrs.get(attr)
        if rule is None:
            return []
        value = rule.expression.serialize()
        names = [str(v) for v in value] if isinstance(value, list) else [str(value)]
        for name in names:
            if not name.replace("_", "a").replace("-", "a").isalnum():
                raise self.error(
                    f"function {block.name!r}: each of {attr} must be a name, not {quote(name)}",
                    rule,
                )
        return names

    # Each expression rule python-hcl2 makes, and the method that evaluates it.
    _KINDS: ClassVar[dict[type, Callable[..., Value]]] = {
        E.ConditionalRule: _conditional,
        E.BinaryOpRule: _binary,
        E.UnaryOpRule: _unary,
        L.IdentifierRule: _name,
        L.IntLitRule: _number,
        L.FloatLitRule: _number,
        L.LiteralValueRule: _literal,
        S.StringRule: _string,
        S.HeredocTemplateRule: _heredoc,
        S.HeredocTrimTemplateRule: _heredoc,
        C.TupleRule: _tuple,
        C.ObjectRule: _object,
        FN.FunctionCallRule: _call,
        IX.GetAttrExprTermRule: _getattr_rule,
        IX.IndexExprTermRule: _index_rule,
        IX.AttrSplatExprTermRule: _splat,
        IX.FullSplatExprTermRule: _splat,
        FE.ForTupleExprRule: _for,
        FE.ForObjectExprRule: _for,
        D.TemplateIfRule: _directive,
        D.TemplateForRule: _directive,
    }
