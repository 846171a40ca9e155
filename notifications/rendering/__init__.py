"""Template rendering at send time: sandboxed Jinja2, HTML-escaped in ``html``, bounded. One layer
for every sender: single sends, notification types (events) and campaigns render through it.

A template sees the recipient's ``attributes`` plus ``user_id``, ``email``, ``locale``,
``timezone``, and for an event its ``data``; missing variables render empty. Every render is
bounded (:mod:`notifications.rendering.bounds`); anything that goes wrong raises
:class:`RenderError`, recorded as ``template_error`` (never retried). Saving runs
:func:`check_parts` (dry renders on :func:`sample_contexts`), a convenience, not a guarantee: the
send-time bounds are what hold. Locale fallback: ``de-AT``, ``de``, the default, any. The rules:
docs/CAMPAIGNS.md "Render bounds", docs/TYPES.md "Limits", docs/SECURITY.md.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from functools import lru_cache

from jinja2 import StrictUndefined, TemplateError, TemplateSyntaxError, UndefinedError, meta, nodes
from jinja2.sandbox import SecurityError

from notifications.content_limits import empty_body_problem, rendered_problem
from notifications.rendering import budget as render_budget
from notifications.rendering.bounds import BoundedSandbox
from notifications.rendering.budget import RenderBoundExceeded
from notifications.rendering.checking import CheckBudget, CheckBudgetSpent, check_budget

_text_env = BoundedSandbox(autoescape=False)
_html_env = BoundedSandbox(autoescape=True)
PARTS = ("title", "body", "html")
#: The first recipient a save-time dry render uses; every other variable a template names is "Sample".
SAMPLE_CONTEXT = {"user_id": "sample-user", "email": "sample@example.com", "locale": "en", "timezone": "UTC"}
SAMPLE_VALUE = "Sample"
_LOCALES = ("en", "de", "de-AT", "fr-CA", "pt-BR", "ja", "")
_ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Pacific/Kiritimati", "")
_NAMES = ("Ada", "Zoë", "Łukasz", "李", "O'Brien", "Jean-Luc", "<b>", "")


class RenderError(Exception):
    """A template could not be compiled or rendered: a syntax error, a sandbox violation, a render
    bound exceeded (then ``bound`` is ``"time"``, ``"iterations"``, ``"output"`` or ``"size"``, and
    the message names it), or any other exception raised while rendering. ``bound`` is ``None``
    for the others. ``code`` is the API's error code for it: ``render_bound`` (a bound),
    ``undefined_variable`` (a variable the template's kind never has) or ``template_syntax``."""

    def __init__(self, message: str, bound: str | None = None, code: str = "") -> None:
        super().__init__(message)
        self.bound = bound
        self.code = code or ("render_bound" if bound else "template_syntax")


@dataclass(frozen=True)
class Rendered:
    title: str
    body: str
    html: str


def _render_error(exc: Exception) -> RenderError:
    """The RenderError for an exception raised while compiling or rendering."""
    if isinstance(exc, RenderError):
        return exc
    if isinstance(exc, RenderBoundExceeded):
        return RenderError(f"template exceeds its render bound: {exc}", bound=exc.bound)
    if isinstance(exc, TemplateError):  # includes jinja2.sandbox.SecurityError
        return RenderError(f"template error: {exc}")
    return RenderError(f"template error: {type(exc).__name__}: {exc}"[:1000])


def sample_contexts(names: set[str]) -> list[dict[str, object]]:
    """The recipients a save-time dry render uses (``{name: str}`` for ``names`` and the four fixed
    variables), in order: SAMPLE_CONTEXT with "Sample" for every other name; then three made afresh
    for each call, so a template cannot single the samples out by their values: a realistic one
    (random ids, addresses, names, locales, zones), a numeric one (digits where attributes go,
    no email, locale or zone) and a long one (255-character id, 1,000-character attributes: the
    most an attribute may hold).

    This makes a template that behaves well only on the sample harder to write, not impossible
    (``{% if user_id == "alice" %}``: a value only real data has): the render bounds at send time
    are the guarantee, this check a convenience that names the problem at save time."""
    rnd = random.SystemRandom()

    def token(n: int) -> str:
        return "".join(rnd.choice(string.ascii_lowercase + string.digits) for _ in range(n))

    others = sorted(names - set(SAMPLE_CONTEXT))
    return [
        {**dict.fromkeys(others, SAMPLE_VALUE), **SAMPLE_CONTEXT},
        {**{n: rnd.choice((rnd.choice(_NAMES), token(rnd.randint(1, 40)))) for n in others},
         "user_id": f"{token(rnd.randint(4, 12))}-{token(rnd.randint(2, 12))}",
         "email": f"{token(rnd.randint(1, 20))}@{token(rnd.randint(2, 12))}.{rnd.choice(('com', 'de', 'io', 'net'))}",
         "locale": rnd.choice(_LOCALES), "timezone": rnd.choice(_ZONES)},
        {**{n: str(rnd.randint(1, 10 ** rnd.randint(1, 12))) for n in others},
         "user_id": str(rnd.randint(1, 10 ** 12)), "email": "", "locale": "", "timezone": ""},
        {**{n: token(1000) for n in others}, "user_id": token(255),
         "email": f"{token(64)}@{token(63)}.org", "locale": "de-AT", "timezone": "America/Argentina/ComodRivadavia"},
    ]


#: Tags that load another template: there is no loader, so every send would fail ("no loader for
#: this environment specified"); refused when a template is saved.
_OTHER_TEMPLATES = (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends)


def template_variables(source: str) -> set[str]:
    """The names ``source`` reads that it does not set itself (``{{ data.x }}`` → ``{"data"}``;
    globals such as ``range`` and ``lipsum`` included, ``loop`` not). Raises RenderError for a
    syntax error."""
    try:
        tree = _text_env.parse(source)
    except TemplateSyntaxError as exc:
        raise RenderError(f"template syntax error on line {exc.lineno}: {exc.message}") from None
    names = list(tree.find_all(nodes.Name))
    own = {n.name for n in names if n.ctx in ("store", "param")} | {"loop"}
    return {n.name for n in names if n.ctx == "load"} - own


def check_parts(parts: dict[str, str], *, event_data: bool = True, content: bool = True,
                channel: str = "") -> dict[str, RenderError]:
    """Save-time check of a message's parts (``{"title": src, "body": src, "html": src}``, any subset):
    ``{part: RenderError}`` for each part that does not compile, then, if all compile, dry renders of
    them together for each of :func:`sample_contexts`, naming the part where a bound was first passed;
    ``{}`` = accepted. Other render errors are not reported (real data may differ), except the
    sandbox's refusal and endless recursion, which no data changes.

    ``event_data``: the context has the event's ``data`` (a type's templates and keys); without it
    (a campaign's) an undefined variable on the first sample, ``data`` included, is refused
    (:func:`undefined_problem`). ``content`` applies the empty-body rule and ``channel`` the send
    path's rendered-content rules to the dry renders (docs/TYPES.md, "Limits"). The check spends the
    request's check budget (:mod:`notifications.rendering.checking`; ``CheckBudgetSpent``,
    ``ChecksBusy``). Not a guarantee: what holds at send time are the render bounds.
    """
    if not any(source and "{" in source for source in parts.values()):
        return _check_literal(parts, content, channel)  # nothing to compile or render
    with check_budget() as request:
        return _check_parts(parts, event_data, content, request, channel)


def _check_literal(parts: dict[str, str], content: bool, channel: str) -> dict[str, RenderError]:
    """The rules of :func:`check_parts` for parts without template syntax: what they say is what every
    send renders (a body of braille blanks, a 1,700-character SMS fail every send the same way)."""
    if not content:
        return {}
    if "body" in parts and empty_body_problem(parts["body"]):
        return {"body": RenderError(f"every send would fail: {empty_body_problem('')}", code="empty_body")}
    problem = channel and rendered_problem(channel, parts.get("title", ""), parts.get("body", ""),
                                           parts.get("html", ""), None)
    return _channel_refusal(problem, "every send would fail") if problem else {}


def _channel_refusal(problem: str, where: str) -> dict[str, RenderError]:
    """A rendered-content ``problem`` of the send path as the save's refusal, on the part it names."""
    part = "title" if " title " in f" {problem} " else "body"
    return {part: RenderError(f"{where}: {problem}", code="template_error")}


def _check_parts(parts: dict[str, str], event_data: bool, content: bool,
                 request: CheckBudget, channel: str = "") -> dict[str, RenderError]:
    errors: dict[str, RenderError] = {}
    names: set[str] = set()
    body_reads_data = False
    for part, source in parts.items():
        if not source or "{" not in source:
            continue
        env = _html_env if part == "html" else _text_env
        try:
            request.left()
            _compiled(source, part == "html")
            tree = env.parse(source)
            if next(tree.find_all(_OTHER_TEMPLATES), None) is not None:
                errors[part] = RenderError("template syntax error: a template cannot include, import or extend "
                                           "another (there are none to load)")
                continue
            undeclared = meta.find_undeclared_variables(tree)
            names |= undeclared
            body_reads_data |= part == "body" and "data" in undeclared
        except TemplateSyntaxError as exc:
            errors[part] = RenderError(f"template syntax error on line {exc.lineno}: {exc.message}")
        except TemplateError as exc:
            errors[part] = RenderError(f"template syntax error: {exc}")
        except CheckBudgetSpent:
            raise
        except Exception as exc:
            errors[part] = _render_error(exc)
    if errors:
        return errors
    names -= set(_text_env.globals)
    contexts = sample_contexts(names if event_data else names - {"data"})
    if not event_data and "data" in names:  # reserved: any use fails as {{ data.code }} does
        contexts[0]["data"] = StrictUndefined(name="data")
    check_body = content and "{" in parts.get("body", "") and not (event_data and body_reads_data)
    configured = render_budget.limits()
    check_channel = content and channel and not (event_data and "data" in names)
    empty_for = 0  # sample recipients whose body rendered empty
    broken: list[str] = []  # for each sample recipient whose render breaks a rule of the channel: which
    for number, context in enumerate(contexts, 1):
        left = request.left()
        rendered: dict[str, str] = {}
        with render_budget.budget(configured._replace(cpu_seconds=min(configured.cpu_seconds, left))):
            for part, source in parts.items():
                try:
                    text = rendered[part] = _render(source, part == "html", context)
                    if part == "body" and empty_body_problem(text):
                        empty_for += 1
                except Exception as exc:
                    error = _render_error(exc)
                    where = f"recipient {number} of {len(contexts)}"
                    if error.bound == "time" and left < configured.cpu_seconds:
                        raise CheckBudgetSpent(request.total_ms) from None
                    if error.bound is not None:
                        return {part: RenderError(f"a dry render on sample data ({where}) failed: {error}",
                                                  bound=error.bound)}
                    if isinstance(exc, SecurityError | RecursionError):
                        # The sandbox refusing an attribute, or a macro calling itself forever, does
                        # not depend on the recipient's data: every send would fail the same way.
                        return {part: RenderError(f"a dry render on sample data ({where}) failed, as every "
                                                  f"send would: {error}")}
                    if not event_data and number == 1 and isinstance(exc, UndefinedError):
                        return {part: RenderError(f"a dry render on sample data ({where}) failed, as every "
                                                  f"send would: {undefined_problem(exc)}", code="undefined_variable")}
                    break  # another error: this recipient's render stops here, as a send's would
            else:
                problem = check_channel and rendered_problem(channel, rendered.get("title", ""),
                                                             rendered.get("body", ""), rendered.get("html", ""), None)
                if problem and not empty_body_problem(rendered.get("body", "x")):
                    broken.append(problem)
    if broken and len(broken) == len(contexts):
        return _channel_refusal(broken[0], f"a dry render on sample data (all {len(contexts)} recipients) failed, "
                                           "as every send would")
    if check_body and empty_for == len(contexts):
        return {"body": RenderError(f"a dry render on sample data (all {len(contexts)} recipients, the first with "
                                    f"every attribute the template names) failed, as every send would: "
                                    f"{empty_body_problem('')}", code="empty_body")}
    return {}


def undefined_problem(exc: UndefinedError) -> str:
    """``line 3: 'data' is undefined`` (the template line Jinja's traceback names), with, for
    ``data``, where that variable exists: the rule of a campaign's template context."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    text = (f"line {line}: " if line else "") + str(exc.message or exc)
    if "'data' is undefined" in text:
        text += (" (a campaign's template has no data: only a notification type's templates read the event's "
                 "{{ data.* }}; a campaign's read the recipient's attributes and user_id, email, locale, timezone)")
    return text


@lru_cache(maxsize=512)
def _compiled(source: str, html: bool):
    env = _html_env if html else _text_env
    render_budget.check_tokens(env, source)  # parsing and compiling cost time per token
    return env.from_string(source)


def context_for(recipient, data: dict | None = None) -> dict:
    """The render context of ``recipient``: its attributes (as strings) and ``user_id``, ``email``,
    ``locale``, ``timezone``; with ``data`` (an event's JSON object) under ``data``. ``data`` is
    reserved: an attribute of that name is never seen (a campaign's template has no ``data``)."""
    ctx: dict = {str(k): str(v) for k, v in (recipient.attributes or {}).items() if str(k) != "data"}
    ctx.update(user_id=recipient.user_id, email=recipient.email, locale=recipient.locale,
               timezone=recipient.timezone)
    if data is not None:
        ctx["data"] = data
    return ctx


def pick_variant(variants: list, locale: str, default_locale: str):
    """Choose among ``variants`` (objects with a ``locale``) the one for ``locale``, per the fallback
    order in the module docstring; ``None`` when there are none."""
    by_locale = {v.locale.lower(): v for v in variants}
    wanted = (locale or "").lower().replace("_", "-")
    for candidate in (wanted, wanted.split("-")[0], default_locale.lower(), default_locale.lower().split("-")[0]):
        if candidate and candidate in by_locale:
            return by_locale[candidate]
    return variants[0] if variants else None


def _render(source: str, html: bool, context: dict) -> str:
    # A part with no template syntax renders to itself (autoescape only touches variables): skipping
    # Jinja's per-render context set-up for it halves the rendering cost of a typical campaign.
    if not source:
        return ""
    if "{" not in source:
        return source
    return _compiled(source, html).render(context)


def render_parts(parts: dict[str, str], context: dict) -> dict[str, str]:
    """Render ``{name: source}`` with ``context`` within one render budget: ``{name: text}``. The
    part named ``html`` is rendered with autoescaping, the others as plain text (push ``data``
    values are parts too: ``data.<key>``).

    Raises RenderError: for anything that goes wrong, bounds included (see the module docstring).
    """
    if not any("{" in source for source in parts.values()):
        return dict(parts)  # nothing to render, nothing to bound
    try:
        with render_budget.budget():
            return {name: _render(source, name == "html", context) for name, source in parts.items()}
    except Exception as exc:
        raise _render_error(exc) from None


def render_strings(title: str, body: str, html: str, context: dict) -> Rendered:
    """Render the three parts with ``context`` (``{name: str}``), within one render budget.

    Raises RenderError: for anything that goes wrong, bounds included (see the module docstring).
    """
    out = render_parts({"title": title, "body": body, "html": html}, context)
    return Rendered(title=out["title"], body=out["body"], html=out["html"])


def render_variant(variants: list, default_locale: str, recipient, *, what: str) -> Rendered:
    """Render the variant of ``variants`` (objects with ``locale``, ``title``, ``body``, ``html``)
    for ``recipient``'s locale (fallback order in the module docstring). ``what`` names the
    template in the error. Raises RenderError (none to pick, or the render failed)."""
    variant = pick_variant(variants, recipient.locale, default_locale)
    if variant is None:
        raise RenderError(f"{what} has no variants")
    return render_strings(variant.title, variant.body, variant.html, context_for(recipient))
