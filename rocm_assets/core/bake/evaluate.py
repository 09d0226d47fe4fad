"""Evaluate a parsed bake file the way `docker buildx bake` does.

python-hcl2 has no expression evaluator, so this one walks its typed tree. It covers what bake
files need: variables (defaults, env overrides typed as bake types them, validation), top-level
attributes (bake's stand-in for locals, and overrides of a variable's default), user functions,
interpolation and template directives, heredocs, conditionals, operators, object/tuple literals,
for expressions, indexing, splats and `target.<name>.<attr>` references. Targets, groups and
matrices are in `blocks`.

Every evaluation runs on a `Budget` (see `limits`): nesting, steps, string and collection sizes
are bounded, and any error is a one-line BakeError naming the file and line. What it does not
follow exactly as bake does (`errors.Unfollowed`, raised deep inside) becomes NeedsBuildx at the
line being evaluated: the evaluator refuses rather than guess. Numbers are go-cty's (`ctynum`).
"""

import contextlib
import functools
import platform
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar

from hcl2.rules import (
    containers as C,
    directives as D,
    expressions as E,
    for_expressions as FE,
    functions as FN,
    indexing as IX,
    literal_rules as L,
    strings as S,
)

from rocm_assets.core.bake import blocks, calls, ctynum, operators, templates, variables
from rocm_assets.core.bake.errors import BakeError, BakeLimitError, NeedsBuildx, Unfollowed
from rocm_assets.core.bake.evaluator import Expansion
from rocm_assets.core.bake.limits import MAX_DEPTH, Budget, LimitError, quote
from rocm_assets.core.bake.parse import BakeFile, line_of
from rocm_assets.core.bake.values import CtySet, iteration, to_bool, to_int, to_string, type_name

Value = Any

# What BAKE_LOCAL_PLATFORM is on this machine (containerd's platforms.DefaultString).
_PLATFORMS = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64"}
# What Python raises for a bad operand deep in an operation: turned into a BakeError with the
# line of the expression that caused it.
_OPERAND_ERRORS = (ValueError, TypeError, ArithmeticError, LookupError)


class Evaluation:
    """Values of one bake file under one environment, computed lazily and memoised."""

    def __init__(self, bake: BakeFile, env: Mapping[str, str], budget: Budget | None = None):
        self.bake = bake
        self.env = env
        self.budget = budget or Budget()
        self.depth = 0
        self._values: dict[str, Value] = {}
        self._stack: list[str] = []
        self.calls: list[str] = []
        # id(template rule) -> (the rule, its compiled parts): see templates._compile.
        self.templates: dict[int, tuple[Any, list]] = {}
        # target name -> its own blocks decoded and merged (see blocks.own); never mutated.
        self.owned: dict[str, dict[str, Value]] = {}

    # ---- errors and bounds ----
    def error(self, message: str, rule: Any = None, line: int | None = None) -> BakeError:
        return BakeError(
            message, path=self.bake.path, line=line or (line_of(rule) if rule else None)
        )

    def refusal(self, exc: Unfollowed, rule: Any = None, line: int | None = None) -> NeedsBuildx:
        return NeedsBuildx(
            str(exc), path=self.bake.path, line=line or (line_of(rule) if rule else None)
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
    @functools.cached_property
    def builtins(self) -> dict[str, str]:
        """bake's own variables; they cannot be overridden."""
        local = _PLATFORMS.get(platform.machine())
        return {"BAKE_CMD_CONTEXT": "cwd://", **({"BAKE_LOCAL_PLATFORM": local} if local else {})}

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
            if name in self.builtins:
                result: Value = self.builtins[name]
            elif name == "BAKE_LOCAL_PLATFORM":
                raise Unfollowed(f"BAKE_LOCAL_PLATFORM on a {platform.machine()} machine")
            elif name in self.bake.variables:
                block = self.bake.variables[name]
                try:
                    result = variables.value(self, block)
                except Unfollowed as exc:
                    raise self.refusal(exc, line=block.line) from None
                except ValueError as exc:
                    raise self.error(quote(str(exc), 200)[1:-1], line=block.line) from None
                with self.limits(line=block.line):
                    self.budget.built(result)
            elif name in self.bake.attrs:
                result = self.expr(self.bake.attrs[name].expression, {})
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

    def validate(self) -> None:
        """Run every variable's validation blocks, as bake does once all values are known."""
        try:
            variables.validate(self)
        except Unfollowed as exc:
            raise self.refusal(exc) from None

    # ---- targets (see blocks) ----
    @functools.cached_property
    def expansion(self) -> Expansion:
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
                raise Unfollowed(f"the expression {type(rule).__name__}")
            return kind(self, rule, scope)
        except LimitError as exc:
            raise BakeLimitError(str(exc), path=self.bake.path, line=line_of(rule)) from None
        except Unfollowed as exc:
            raise self.refusal(exc, rule) from None
        except _OPERAND_ERRORS as exc:
            raise self.error(quote(str(exc), 200)[1:-1], rule) from None
        finally:
            self.depth -= 1

    def _conditional(self, rule: E.ConditionalRule, scope: Mapping[str, Value]) -> Value:
        return operators.conditional(self, rule, scope)

    def _unary(self, rule: E.UnaryOpRule, scope: Mapping[str, Value]) -> Value:
        return operators.unary(self, rule, scope)

    def _binary(self, rule: E.BinaryOpRule, scope: Mapping[str, Value]) -> Value:
        return operators.binary(self, rule, scope)

    def _name(self, rule: L.IdentifierRule, scope: Mapping[str, Value]) -> Value:
        return self._identifier(rule.serialize(), rule, scope)

    def _number(self, rule: Any, scope: Mapping[str, Value]) -> Value:
        # The token's own text: python-hcl2 keeps it, and bake reads it at 512 bits.
        return ctynum.literal(str(rule.token.value))

    def _literal(self, rule: L.LiteralValueRule, scope: Mapping[str, Value]) -> Value:
        return rule.serialize()  # python-hcl2 already maps true/false/null

    def _string(self, rule: S.StringRule, scope: Mapping[str, Value]) -> Value:
        return self.built(templates.template(self, rule, rule.string_parts, scope), rule)

    def _heredoc(self, rule: Any, scope: Mapping[str, Value]) -> Value:
        return self.built(templates.heredoc(self, rule, scope), rule)

    def _directive(self, rule: Any, scope: Mapping[str, Value]) -> Value:
        return self.built(templates.template(self, rule, [rule], scope), rule)

    def _tuple(self, rule: C.TupleRule, scope: Mapping[str, Value]) -> Value:
        # A loop, not a comprehension: in Python 3.11 that is one more frame per level.
        items = []
        for element in rule.elements:
            items.append(self.expr(element, scope))  # noqa: PERF401
        return self.built(items, rule)

    def _object(self, rule: C.ObjectRule, scope: Mapping[str, Value]) -> Value:
        obj = {}
        for element in rule.elements:
            key = self._key(element.key, scope)
            obj[key] = self.expr(element.expression, scope)
        return self.built(obj, rule)

    def _index_rule(self, rule: IX.IndexExprTermRule, scope: Mapping[str, Value]) -> Value:
        target, index = rule.children
        return self._index(self.expr(target, scope), index, scope, rule)

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
            key = ctynum.literal(str(key))
        if isinstance(base, CtySet):
            raise self.error("elements of a set cannot be indexed", rule)
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
        if isinstance(base, CtySet):
            raise Unfollowed("a splat over a set")
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
        first = intro.first_iterator.serialize()
        second = intro.second_iterator.serialize() if intro.second_iterator else None
        tuple_out: list[Value] = []
        object_out: dict[str, Value] = {}
        for key, item in iteration(collection):
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
            key = self.expr(rule.expression, scope)
        else:
            value = rule.value
            if isinstance(value, L.IdentifierRule):
                return value.serialize()
            key = self.expr(value, scope)
        if key is None:
            raise self.error("can't use a null value as a key", rule)
        return to_string(key)

    def _call(self, rule: FN.FunctionCallRule, scope: Mapping[str, Value]) -> Value:
        return calls.call(self, rule, scope)

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
