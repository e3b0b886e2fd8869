from django.urls import path

from memory_app.urls_curation import urlpatterns as curation_urls
from memory_app.views import accounts, context_detail, contexts, runs

urlpatterns = [
    path("accounts/login/", accounts.login, name="login"),
    path("accounts/logout/", accounts.logout, name="logout"),
    path("", contexts.context_list, name="home"),
    path("contexts/", contexts.context_list, name="contexts"),
    path("contexts/<int:context_id>/", context_detail.context_page, name="context"),
    path("contexts/<int:context_id>/runs/", context_detail.context_runs, name="context-runs"),
    path(
        "contexts/<int:context_id>/messages/<int:message_id>/prune/",
        context_detail.message_prune,
        name="message-prune",
    ),
    path("runs/<int:run_id>/", runs.run_start, name="run"),
    path("runs/<int:run_id>/live/", runs.run_live, name="run-live"),
    path("runs/<int:run_id>/steps/<int:position>/", runs.run_step, name="run-step"),
    path(
        "runs/<int:run_id>/steps/<int:position>/model-input/",
        runs.step_model_input,
        name="step-model-input",
    ),
    path(
        "runs/<int:run_id>/steps/<int:position>/transcript/",
        runs.step_transcript,
        name="step-transcript",
    ),
    path("runs/<int:run_id>/steps/<int:position>/prune/", runs.step_prune, name="step-prune"),
    *curation_urls,
]
