"""Run logbook: step list beside the current step, stepped through by URL (/runs/<id>/steps/<n>/).

A run still being written is followed by polling `/runs/<id>/live/` (htmx, every 2 s): the answer
appends the new steps to the list and their bars to the timeline (laid out in the page), and
refreshes the header, the timeline's caption and the stepper out of band, never the step the
operator is reading, so their place and open details stay as they were.

Steps can be renumbered while the page is open: a step that starts earlier than steps already
written (trace ingest writes a run's task step when the root span ends, last) takes its place in
start order. The poll names the steps the page holds by id, so it notices: it then answers the
whole logbook at the same step under its new number (the URL follows), and the step's opened
details are kept (`hx-preserve`: their loads name the step by id, so they stay right).
"""

from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from memory_app.audit import Actor
from memory_app.models import Run, RunStatus, Step
from memory_app.queries import model_input as model_input_queries
from memory_app.queries.logbook import (
    LIVE_TIMELINE_MAX_STEPS,
    live_bars,
    run_cost,
    run_timeline,
    spans_being_mapped,
    step_detail,
    step_nav,
    step_window,
    steps_after,
    timeline_totals,
    transcript_upto,
)
from memory_app.queries.memory_history import step_memories
from memory_app.queries.run_comparison import previous_run
from memory_app.roles import require
from memory_app.services.curation import steps_set_pruned
from memory_app.views.common import htmx_partial, invalid_form, page, replica_page, wants_fragment
from memory_app.views.forms import PrunedForm, RunLiveForm, StepDetailForm
from memory_app.views.scores import review_blocks


def _run(run_id: int, *, prompt: bool = False) -> Run:
    """The run with its context; its system prompt only when the page shows it (a whole page,
    the model input), not for every step a fragment brings."""
    runs = Run.objects.select_related("context")
    return get_object_or_404(runs if prompt else runs.defer("system_prompt"), pk=run_id)


@require("view")
@require_GET
@replica_page
def run_start(request, run_id: int):
    run = _run(run_id, prompt=True)
    if run.last_position == 0:
        return page(request, "memory_app/run.html", _logbook_context(run, None))
    return redirect("run-step", run_id=run.pk, position=1)


def _logbook_context(run: Run, position: int | None) -> dict:
    """What the logbook partial needs at `position` (None: the run has no steps yet)."""
    # The page's header links to a comparison with the context's previous run; a callable, so
    # the template reads it only where it draws the header (not in an htmx partial), and only
    # looked for when the context holds another run.
    header = {"previous_run": lambda: previous_run(run) if run.context.run_count > 1 else None}
    mapping = spans_being_mapped(run)
    if position is None:
        return {
            **header,
            "run": run,
            "step": None,
            "mapping": mapping,
            "live": run.status == RunStatus.RUNNING or mapping,
            "cost": run_cost(run=run),
            **review_blocks(run, None),
        }
    step = step_detail(run=run, position=position)
    if step is None:
        raise Http404(f"run {run.pk} has no step {position}")
    nav = step_nav(run=run, position=position)
    window = step_window(run=run, position=position)
    # The poll asks for steps after the last one the page holds (a step written between
    # reading the run and its steps is already in the list).
    shown = max([nav.last, *(s.position for s in window.steps)])
    live = run.status == RunStatus.RUNNING or mapping
    # A running run's timeline grows a bar per step in the page (see logbook.live_bars).
    live_timeline = live and run.last_position <= LIVE_TIMELINE_MAX_STEPS
    if live_timeline:
        timeline = timeline_totals(run=run)
        bars = live_bars(run=run, start=timeline.start)
    else:
        timeline, bars = run_timeline(run=run, position=position), []
    return {
        **header,
        "run": run,
        "mapping": mapping,
        "step": step,
        "nav": nav,
        "window": window,
        "timeline": timeline,
        "live_timeline": live_timeline,
        "live_bars": bars,
        "cost": run_cost(run=run),
        "live": live,
        "shown": shown,
        # What the poll names the page's steps by (only a running run's page polls).
        "seen": {"step": step.pk, "last": _step_id(run, shown) if live else None},
        "tail": not window.has_later,
        "step_memories": step_memories(step.pk),
        **review_blocks(run, step),
    }


def _step_id(run: Run, position: int) -> int | None:
    return (
        Step.objects.filter(context_id=run.context_id, run=run, position=position)
        .values_list("pk", flat=True)
        .first()
    )


@require("view")
@require_GET
@replica_page
@htmx_partial("logbook")
def run_step(request, run_id: int, position: int):
    run = _run(run_id, prompt=not wants_fragment(request))
    return page(request, "memory_app/run.html", _logbook_context(run, position))


# The poll's usual answer is the `live-update` partial (only new steps and out-of-band parts);
# when the page needs the whole logbook again, the `live-whole` partial.
@require("view")
@require_GET
@htmx_partial("live-whole")
def run_live(request, run_id: int):
    """What changed in a run since the page saw step `after` (htmx poll; see the module doc).

    `position` is the step on screen (absent while the run had no steps: the answer is then the
    whole logbook, at step 1 once there is one); `tail=1` when the page's step list ends with the
    run's last step, so new steps belong at its end.
    """
    run = _run(run_id)
    form = RunLiveForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    data = form.cleaned_data
    after, position = data["after"] or 0, data["position"]
    step_id, last_id = data["step"], data["last"]
    if position is not None and _renumbered(run, (position, step_id), (after, last_id)):
        # Steps moved under the page: the whole logbook, at the same step under its new number.
        moved = (
            Step.objects.filter(context_id=run.context_id, run=run, pk=step_id)
            .values_list("position", flat=True)
            .first()
        )
        response = page(request, "memory_app/run.html", _logbook_context(run, moved or 1))
        response["HX-Retarget"] = "#logbook"
        response["HX-Reswap"] = "outerHTML"
        response["HX-Replace-Url"] = reverse("run-step", args=[run.pk, moved or 1])
        return response
    if position is None:
        context = _logbook_context(run, 1 if run.last_position else None)
        response = page(request, "memory_app/run.html", context)
        if run.last_position:
            response["HX-Replace-Url"] = reverse("run-step", args=[run.pk, 1])
        return response
    if position > run.last_position:
        raise Http404(f"run {run.pk} has no step {position}")
    fresh = steps_after(run=run, after=after)
    shown = fresh.steps[-1].position if fresh.steps else after
    mapping = spans_being_mapped(run)
    # Only what changed: the new steps' bars (when the page draws them one by one) and the
    # timeline's caption, never the whole picture again.
    timeline = timeline_totals(run=run)
    fresh_bars = (
        live_bars(run=run, start=timeline.start, after=after, limit=len(fresh.steps))
        if data["tl"] and fresh.steps
        else []
    )
    context = {
        "run": run,
        "mapping": mapping,
        "fresh": fresh,
        "fresh_bars": fresh_bars,
        "live_timeline": data["tl"],
        "shown": shown,
        "seen": {"step": step_id, "last": fresh.steps[-1].pk if fresh.steps else last_id},
        "tail": data["tail"],
        "nav": step_nav(run=run, position=position),
        "timeline": timeline,
        "cost": run_cost(run=run),
        # Keep polling until the page has every step of a finished run.
        "live": run.status == RunStatus.RUNNING or mapping or fresh.has_later,
    }
    return page(request, "memory_app/run.html#live-update", context)


def _renumbered(run: Run, *held: tuple[int, int | None]) -> bool:
    """Whether a step the page holds, as (position, id), is no longer at that position."""
    held = [(position, pk) for position, pk in held if pk is not None and position]
    if not held:
        return False
    now = dict(
        Step.objects.filter(
            context_id=run.context_id, run=run, position__in=[p for p, _ in held]
        ).values_list("position", "pk")
    )
    return any(now.get(position) != pk for position, pk in held)


def _step_position(run: Run, position: int, step_id: int | None) -> int:
    """The position of the step asked for: `?step=<id>` (what a page loads its details by, so they
    stay right when steps are renumbered) wins over the URL's position."""
    found = Step.objects.filter(
        context_id=run.context_id,
        run=run,
        **({"pk": step_id} if step_id else {"position": position}),
    )
    moved = found.values_list("position", flat=True).first()
    if moved is None:
        raise Http404(f"run {run.pk} has no step {step_id or position}")
    return moved


@require("view")
@require_GET
@replica_page
@htmx_partial("model-input")
def step_model_input(request, run_id: int, position: int):
    run = _run(run_id, prompt=True)
    form = StepDetailForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    position = _step_position(run, position, form.cleaned_data["step"])
    seen = model_input_queries.model_input(run=run, position=position)
    context = {"run": run, "position": position, "model_input": seen}
    return page(request, "memory_app/step_extra.html", context)


@require("view")
@require_GET
@replica_page
@htmx_partial("transcript")
def step_transcript(request, run_id: int, position: int):
    run = get_object_or_404(Run.objects.select_related("context"), pk=run_id)
    form = StepDetailForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    position = _step_position(run, position, form.cleaned_data["step"])
    messages, omitted = transcript_upto(run=run, position=position)
    context = {"run": run, "position": position, "transcript": messages, "omitted": omitted}
    return page(request, "memory_app/step_extra.html", context)


@require("curate")
@require_POST
@htmx_partial("logbook")
def step_prune(request, run_id: int, position: int):
    """Prune or restore one step (a pruned step is left out of every transcript); under htmx
    the logbook at that step comes back."""
    run = _run(run_id)
    step = get_object_or_404(
        Step.objects.only("id"), context_id=run.context_id, run=run, position=position
    )
    form = PrunedForm(request.POST)
    if not form.is_valid():
        return invalid_form(request, form)
    steps_set_pruned(
        run=run,
        ids=[step.pk],
        pruned=form.cleaned_data["pruned"],
        actor=Actor.for_user(request.user),
    )
    if not wants_fragment(request):
        return redirect("run-step", run_id=run.pk, position=position)
    return page(request, "memory_app/run.html", _logbook_context(_run(run_id), position))
