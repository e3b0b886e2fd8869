// Dashboard behaviour that htmx attributes cannot express. Loaded as a file: the
// Content-Security-Policy forbids inline script and inline event handlers.
(function () {
  "use strict";

  // Run logbook: j / → next step, k / ← previous step, e next error, E previous error.
  // Each shortcut clicks the matching link, so htmx, the URL and history behave as for a click.
  var SHORTCUTS = {
    j: "next", ArrowRight: "next",
    k: "prev", ArrowLeft: "prev",
    e: "next-error", E: "prev-error"
  };

  function isTyping(el) {
    return !!el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));
  }

  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || isTyping(event.target)) return;
    var action = SHORTCUTS[event.key];
    if (!action) return;
    var link = document.querySelector('#logbook [data-shortcut="' + action + '"]');
    if (!link) return;
    event.preventDefault();
    link.click();
  });

  // After a jump to a sequence number, bring that message into view.
  function revealTarget() {
    var target = document.querySelector(".is-target");
    if (target && !target.dataset.revealed) {
      target.dataset.revealed = "1";
      target.scrollIntoView({ block: "center" });
    }
  }

  // Keep the current step visible in the step list (the list scrolls on its own on wide screens).
  function revealCurrentStep() {
    var list = document.querySelector("#logbook .step-list");
    var current = list && list.querySelector(".current");
    if (current && list.scrollHeight > list.clientHeight) {
      list.scrollTop = current.offsetTop - list.clientHeight / 2;
    }
  }

  function settle(event) {
    // A live run's poll only appends steps: the operator's scroll stays where they left it.
    var source = event && event.detail && event.detail.elt;
    if (source && source.hasAttribute && source.hasAttribute("data-live-poll")) return;
    revealTarget();
    revealCurrentStep();
  }

  document.addEventListener("DOMContentLoaded", settle);
  document.addEventListener("htmx:afterSettle", settle);
})();
