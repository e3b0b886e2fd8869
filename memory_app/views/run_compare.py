"""Two runs compared: `/runs/compare/?a=<run>&b=<run>` is the page's address (a deep link; `a` is
the baseline, the deltas are b − a). The runs table's checkboxes send `run` twice, answered by a
redirect to that address with the earlier-started run as `a`. Runs of different contexts may be
compared. A row shows the heads of long texts; its "more" loads the step's outputs whole."""

from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.http import require_GET

from memory_app.models import RUN_STARTED, Run, Step
from memory_app.queries.run_comparison import DIFFERENCES, compare_runs
from memory_app.roles import require
from memory_app.views.common import htmx_partial, invalid_form, page, query_string, replica_page
from memory_app.views.forms import RunCompareForm


def _run(run_id: int) -> Run:
    return get_object_or_404(
        Run.objects.select_related("context").defer("system_prompt"), pk=run_id
    )


def _steps_base(run: Run) -> str:
    step_url = reverse("run-step", args=[run.pk, 1])
    return step_url[: step_url.rindex("/1/") + 1]


def compare_url(a: int, b: int) -> str:
    return reverse("run-compare") + "?" + query_string(a=a, b=b)


@require("view")
@require_GET
@replica_page
def run_compare(request):
    form = RunCompareForm(request.GET)
    if not form.is_valid():
        return invalid_form(request, form)
    data = form.cleaned_data
    if data["run"]:
        picked = list(
            Run.objects.filter(pk__in=data["run"])
            .annotate(started=RUN_STARTED)
            .order_by("started", "pk")
            .values_list("pk", flat=True)
        )
        if len(picked) != 2:
            missing = sorted(set(data["run"]) - set(picked))
            raise Http404(f"no run {missing[0]}")
        return redirect(compare_url(*picked))
    a, b = _run(data["a"]), _run(data["b"])
    comparison = compare_runs(a, b)
    context = {
        "cmp": comparison,
        "a": a,
        "b": b,
        "differences": DIFFERENCES,
        # Each side's steps URL, `<base><position>/` (reversed once: a row links two steps).
        "a_steps": _steps_base(a),
        "b_steps": _steps_base(b),
        "step_delta": b.step_count - a.step_count,
        "error_delta": b.error_count - a.error_count,
        "swap_url": compare_url(b.pk, a.pk),
        "nav_active": "runs",
    }
    return page(request, "memory_app/compare.html", context)


@require("view")
@require_GET
@replica_page
@htmx_partial("step-outputs")
def step_outputs(request, run_id: int, position: int):
    """One step's tool calls, observations, action output and error in full (a comparison row's
    "more")."""
    run = _run(run_id)
    step = get_object_or_404(
        Step.objects.defer("model_input_messages", "payload"),
        context_id=run.context_id,
        run=run,
        position=position,
    )
    step.tool_call_list = list(step.tool_calls.filter(context_id=run.context_id))
    return page(request, "memory_app/step_outputs.html", {"run": run, "step": step})
