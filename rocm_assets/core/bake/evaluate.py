"""Evaluate a parsed bake file the way `docker buildx bake` does.

python-hcl2 has no expression evaluator, so this one walks its typed tree. It covers what bake
files need: variables (defaults, env overrides typed as bake types them, validation), top-level
attributes (bake's stand-in for locals), user functions, interpolation and template directives,
heredocs, conditionals, operators, object/tuple literals, for expressions, indexing, splats,
`target.<name>.<attr>` references, `inherits` and nested groups.
"""

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

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

from rocm_assets.core.bake.errors import BakeError
from rocm_assets.core.bake.functions import (
    FUNCTIONS,
    PARSE_BOOL_FALSE,
    PARSE_BOOL_TRUE,
    to_bool,
    to_number,
    to_string,
    type_name,
)
from rocm_assets.core.bake.parse import BakeFile, Block, label_of, line_of, parse

Value = Any

# Bake's Target.Merge: these keys merge by key across `inherits`; the rest are replaced.
_MERGED_KEYS = frozenset({"args", "labels", "contexts", "annotations", "extra-hosts"})
_BUILTINS = {"BAKE_CMD_CONTEXT": "cwd://", "BAKE_LOCAL_PLATFORM": "linux/amd64"}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


class _TargetNamespace:
    """The value of the bare identifier `target`, so `target.<name>.<attr>` resolves lazily."""


@dataclass(frozen=True)
class _TargetRef:
    name: str


class Evaluation:
    """Values of one bake file under one environment, computed lazily and memoised."""

    def __init__(self, bake: BakeFile, env: dict[str, str]):
        self.bake = bake
        self.env = env
        self._values: dict[str, Value] = {}
        self._stack: list[str] = []
        self._target_attrs: dict[tuple[str, str], Value] = {}

    # ---- errors ----
    def error(self, message: str, rule: Any = None, line: int | None = None) -> BakeError:
        return BakeError(
            message, path=self.bake.path, line=line or (line_of(rule) if rule else None)
        )

    # ---- named values ----
    def names(self) -> list[str]:
        return [*self.bake.variables, *self.bake.attrs]

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
                raise self.error(f"unknown variable {name!r}", rule)
        finally:
            self._stack.pop()
        self._values[name] = result
        return result

    def _variable(self, block: Block) -> Value:
        default_rule = block.attrs.get("default")
        type_rule = block.attrs.get("type")
        default = self.expr(default_rule.expression, {}) if default_rule else None
        declared = self._declared_type(type_rule) if type_rule else None
        if block.name in self.env:
            raw = self.env[block.name]
            kind = declared or (
                type_name(default) if default_rule and default is not None else "string"
            )
            return self._typed(block, raw, kind)
        if default_rule is None:
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
            raise self.error(f"failed to parse {block.name} as bool: {raw!r}", line=block.line)
        if kind == "number":
            try:
                return to_number(raw)
            except ValueError:
                raise self.error(
                    f"failed to parse {block.name} as number: {raw!r}", line=block.line
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
                if label_of(rule.labels[0]) != "validation":
                    continue
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
                    raise self.error(f"variable {block.name}: {text}", condition)

    # ---- targets and groups ----
    def target_attr(self, name: str, attr: str, rule: Any = None) -> Value:
        """`target.<name>.<attr>`: the attribute as written in that target's own blocks."""
        key = (name, attr)
        if key not in self._target_attrs:
            blocks = self.bake.targets.get(name)
            if not blocks:
                raise self.error(f"target.{name}.{attr}: no target named {name!r}", rule)
            found = [b.attrs[attr] for b in blocks if attr in b.attrs]
            if not found:
                raise self.error(f"target.{name}.{attr}: target {name!r} sets no {attr!r}", rule)
            self._target_attrs[key] = self.expr(found[-1].expression, {})
        return self._target_attrs[key]

    def target(self, name: str, _chain: tuple[str, ...] = ()) -> dict[str, Value]:
        """A target's attributes after `inherits`, merged as bake's Target.Merge does."""
        blocks = self.bake.targets.get(name)
        if not blocks:
            raise self.error(f"inherits names no target {name!r}")
        if name in _chain:
            raise self.error(f"inherits cycle: {' -> '.join([*_chain, name])}", line=blocks[0].line)
        own: dict[str, Value] = {}
        for block in blocks:
            if "matrix" in block.attrs:
                raise self.error(f"target {name!r}: matrix is not supported", block.attrs["matrix"])
            for attr, rule in block.attrs.items():
                self._merge(own, attr, self.expr(rule.expression, {}))
        merged: dict[str, Value] = {}
        for parent in own.pop("inherits", None) or []:
            for attr, value in self.target(to_string(parent), (*_chain, name)).items():
                self._merge(merged, attr, value)
        for attr, value in own.items():
            self._merge(merged, attr, value)
        return merged

    @staticmethod
    def _merge(into: dict[str, Value], attr: str, value: Value) -> None:
        if attr in _MERGED_KEYS and isinstance(value, dict) and isinstance(into.get(attr), dict):
            into[attr] = {**into[attr], **{k: v for k, v in value.items() if v is not None}}
        else:
            into[attr] = value

    def group(self, name: str) -> list[str]:
        members: list[str] = []
        for block in self.bake.groups[name]:
            rule = block.attrs.get("targets")
            value = self.expr(rule.expression, {}) if rule else []
            if not isinstance(value, list):
                raise self.error(f"group {name!r}: targets must be a list", rule)
            members.extend(to_string(v) for v in value)
        return members

    # ---- expressions ----
    def truth(self, value: Value, rule: Any) -> bool:
        try:
            return to_bool(value)
        except ValueError as exc:
            raise self.error(str(exc), rule) from None

    def expr(self, rule: Any, scope: Mapping[str, Value]) -> Value:
        if isinstance(rule, E.ExprTermRule):
            return self.expr(rule.expression, scope)
        if isinstance(rule, E.ConditionalRule):
            branch = (
                rule.if_true
                if self.truth(self.expr(rule.condition, scope), rule)
                else rule.if_false
            )
            return self.expr(branch, scope)
        if isinstance(rule, E.BinaryOpRule):
            return self._binary(rule, scope)
        if isinstance(rule, E.UnaryOpRule):
            value = self.expr(rule.expr_term, scope)
            if str(rule.operator) == "!":
                return not self.truth(value, rule)
            return -self._num(value, rule)
        if isinstance(rule, L.IdentifierRule):
            return self._identifier(rule.serialize(), rule, scope)
        if isinstance(rule, L.IntLitRule | L.FloatLitRule):
            return rule.serialize()
        if isinstance(rule, L.LiteralValueRule):
            return rule.serialize()  # python-hcl2 already maps true/false/null
        if isinstance(rule, S.StringRule):
            return self._template(rule.string_parts, scope)
        if isinstance(rule, S.HeredocTemplateRule):
            return self._heredoc(rule, scope)
        if isinstance(rule, C.TupleRule):
            return [self.expr(e, scope) for e in rule.elements]
        if isinstance(rule, C.ObjectRule):
            return {self._key(e.key, scope): self.expr(e.expression, scope) for e in rule.elements}
        if isinstance(rule, FN.FunctionCallRule):
            return self._call(rule, scope)
        if isinstance(rule, IX.GetAttrExprTermRule):
            return self._getattr(
                self.expr(rule.expr_term, scope), rule.get_attr.identifier.serialize(), rule
            )
        if isinstance(rule, IX.IndexExprTermRule):
            target, index = rule.children
            return self._index(self.expr(target, scope), index, scope, rule)
        if isinstance(rule, IX.AttrSplatExprTermRule | IX.FullSplatExprTermRule):
            return self._splat(rule, scope)
        if isinstance(rule, FE.ForTupleExprRule | FE.ForObjectExprRule):
            return self._for(rule, scope)
        raise self.error(f"unsupported expression {type(rule).__name__}", rule)

    def _num(self, value: Value, rule: Any) -> int | float:
        try:
            return to_number(value)
        except ValueError as exc:
            raise self.error(str(exc), rule) from None

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
            same = left == right and type_name(left) == type_name(right)
            return same if op == "==" else not same
        if op not in self._ARITH:
            raise self.error(f"unsupported operator {op!r}", rule)
        try:
            result = self._ARITH[op](self._num(left, rule), self._num(right, rule))
        except ZeroDivisionError:
            raise self.error("division by zero", rule) from None
        return (
            int(result)
            if isinstance(result, float) and result.is_integer() and op != "/"
            else result
        )

    def _identifier(self, name: str, rule: Any, scope: Mapping[str, Value]) -> Value:
        if name in scope:
            return scope[name]
        if name == "target" and name not in self.bake.variables and name not in self.bake.attrs:
            return _TargetNamespace()
        return self.value(name, rule)

    def _getattr(self, base: Value, name: str, rule: Any) -> Value:
        if isinstance(base, _TargetNamespace):
            return _TargetRef(name)
        if isinstance(base, _TargetRef):
            return self.target_attr(base.name, name, rule)
        if isinstance(base, dict):
            if name not in base:
                raise self.error(f"object has no attribute {name!r}", rule)
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
            i = int(self._num(key, rule))
            if not 0 <= i < len(base):
                raise self.error(f"index {i} out of range for a list of {len(base)}", rule)
            return base[i]
        if isinstance(base, dict):
            key = to_string(key)
            if key not in base:
                raise self.error(f"no key {key!r} in object", rule)
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
        return out

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
            else:
                object_out[k] = v
        return tuple_out if isinstance(rule, FE.ForTupleExprRule) else object_out

    def _key(self, rule: Any, scope: Mapping[str, Value]) -> str:
        if isinstance(rule, C.ObjectElemKeyExpressionRule):
            return to_string(self.expr(rule.expression, scope))
        value = rule.value
        if isinstance(value, L.IdentifierRule):
            return value.serialize()
        if isinstance(value, S.StringRule):
            return to_string(self._template(value.string_parts, scope))
        return to_string(value.serialize())

    def _call(self, rule: FN.FunctionCallRule, scope: Mapping[str, Value]) -> Value:
        name = ".".join(i.serialize() for i in rule.identifiers)
        arg_rules = list(rule.arguments.arguments) if rule.arguments is not None else []
        if name in ("try", "can"):
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
            raise self.error(f"unknown function {name!r}", rule)
        try:
            return fn(*args)
        except BakeError:
            raise
        except (ValueError, TypeError, KeyError, IndexError, re.error) as exc:
            raise self.error(f"{name}(): {exc}", rule) from None

    def _try(self, name: str, args: list[Any], scope: Mapping[str, Value], rule: Any) -> Value:
        for arg in args:
            try:
                value = self.expr(arg, scope)
            except BakeError:
                continue
            return True if name == "can" else value
        if name == "can":
            return False
        raise self.error("try(): no argument could be evaluated", rule)

    def _user_function(self, block: Block, args: list[Value], rule: Any) -> Value:
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
        return self.expr(result.expression, local)

    @staticmethod
    def _param_names(block: Block, attr: str) -> list[str]:
        rule = block.attrs.get(attr)
        if rule is None:
            return []
        value = rule.expression.serialize()
        return [str(v) for v in value] if isinstance(value, list) else [str(value)]

    # ---- strings ----
    def _template(self, parts: Any, scope: Mapping[str, Value]) -> str:
        return "".join(self._part(p, scope) for p in parts)

    def _part(self, part: Any, scope: Mapping[str, Value]) -> str:
        if isinstance(part, S.StringPartRule):
            content = part.content
            if isinstance(content, S.InterpolationRule):
                value = self.expr(content.expression, scope)
                try:
                    return to_string(value)
                except ValueError as exc:
                    raise self.error(f"interpolation: {exc}", part) from None
            if isinstance(content, D.TemplateIfRule | D.TemplateForRule):
                return self._directive(content, scope)
            return _unescape(str(content.value))
        if isinstance(part, D.TemplateIfRule | D.TemplateForRule):
            return self._directive(part, scope)
        raise self.error(f"unsupported string part {type(part).__name__}", part)

    def _directive(self, rule: Any, scope: Mapping[str, Value]) -> str:
        children = [c for c in rule.children if c is not None]
        if isinstance(rule, D.TemplateIfRule):
            start = children[0]
            body, otherwise, current = [], [], None
            current = body
            for child in children[1:]:
                if isinstance(child, D.TemplateElseRule):
                    current = otherwise
                elif not isinstance(child, D.TemplateEndifRule):
                    current.append(child)
            chosen = body if self.truth(self.expr(start.condition, scope), rule) else otherwise
            return "".join(self._part(p, scope) for p in chosen)
        start = children[0]
        collection = self.expr(start.collection, scope)
        items = (
            list(collection.items())
            if isinstance(collection, dict)
            else list(enumerate(collection))
        )
        body = [c for c in children[1:] if not isinstance(c, D.TemplateEndforRule)]
        value_name = start.iterator.serialize()
        key_name = start.key_iterator.serialize() if start.key_iterator else None
        out = []
        for key, item in items:
            local = {**scope, value_name: item, **({key_name: key} if key_name else {})}
            out.append("".join(self._part(p, local) for p in body))
        return "".join(out)

    def _heredoc(self, rule: Any, scope: Mapping[str, Value]) -> str:
        raw = str(rule.heredoc if hasattr(rule, "heredoc") else rule.serialize())
        header, _, rest = raw.partition("\n")
        marker = header.lstrip("<-").strip()
        body = rest.rstrip("\n")
        body = body[: body.rfind("\n") + 1] if body.endswith(marker) else body
        lines = body.split("\n")
        if header.startswith("<<-"):
            indents = [len(x) - len(x.lstrip()) for x in lines if x.strip()]
            cut = min(indents, default=0)
            lines = [x[cut:] for x in lines]
        # Re-read the body as a quoted template so interpolation works the same as in strings.
        escaped = "\n".join(lines).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        sub = parse(f'x = "{escaped}"\n', self.bake.path)
        attr = next(c for c in sub.body.children if isinstance(c, B.AttributeRule))
        return self.expr(attr.expression, scope)


def _unescape(text: str) -> str:
    out: list[str] = []
    chars = iter(range(len(text)))
    for i in chars:
        ch = text[i]
        if text.startswith("$${", i) or text.startswith("%%{", i):
            out.append(text[i + 1 : i + 3])
            next(chars)
            next(chars)
        elif ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "u" and i + 5 < len(text):
                out.append(chr(int(text[i + 2 : i + 6], 16)))
                for _ in range(5):
                    next(chars)
                continue
            out.append(_ESCAPES.get(nxt, "\\" + nxt))
            next(chars)
        else:
            out.append(ch)
    return "".join(out)
