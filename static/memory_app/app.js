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
    if (event.key === "?") {
      var help = document.getElementById("shortcuts");
      if (help && !help.open) {
        event.preventDefault();
        help.showModal();
      }
      return;
    }
    // "/" puts the cursor in the top bar's search box.
    var search = document.getElementById("top-search");
    if (event.key === "/" && search) {
      event.preventDefault();
      search.focus();
      search.select();
      return;
    }
    var action = SHORTCUTS[event.key];
    if (!action) return;
    var link = document.querySelector('#logbook [data-shortcut="' + action + '"]');
    var step = action === "next" ? 1 : action === "prev" ? -1 : 0;
    if (step && stepLoading) {
      // A step is still loading: its links lead where the page was, not where the operator
      // already is. Count the press and go there once the step is in (see drainPending).
      event.preventDefault();
      queueStep(step);
      return;
    }
    if (!link) return;
    event.preventDefault();
    link.click();
  });

  // j / k pressed while a step loads, summed (+ forward, - back); the step they lead to is
  // marked in the list at once and loaded when the current load settles.
  var stepLoading = false;
  var pendingSteps = 0;

  function logbookBounds() {
    var logbook = document.getElementById("logbook");
    if (!logbook) return null;
    return { position: Number(logbook.dataset.position), last: Number(logbook.dataset.last) };
  }

  function queueStep(step) {
    var bounds = logbookBounds();
    if (!bounds || !bounds.last) return;
    var target = Math.min(bounds.last, Math.max(1, bounds.position + pendingSteps + step));
    pendingSteps = target - bounds.position;
    document.querySelectorAll("#step-list li.pending").forEach(function (li) {
      li.classList.remove("pending");
    });
    var item = document.getElementById("step-item-" + target);
    if (item) item.classList.add("pending");
  }

  function drainPending() {
    var bounds = logbookBounds();
    if (!pendingSteps || !bounds) {
      pendingSteps = 0;
      return;
    }
    var target = Math.min(bounds.last, Math.max(1, bounds.position + pendingSteps));
    pendingSteps = 0;
    if (target === bounds.position) return;
    // The step list holds the steps around the current one; beyond it, one step at a time.
    var link = document.querySelector("#step-item-" + target + " a");
    if (!link) {
      var toward = target > bounds.position ? "next" : "prev";
      link = document.querySelector('#logbook [data-shortcut="' + toward + '"]');
      pendingSteps = target - bounds.position - (toward === "next" ? 1 : -1);
    }
    if (link) link.click();
  }

  function targetsLogbook(event) {
    var target = event.detail && event.detail.target;
    return !!target && target.id === "logbook";
  }

  document.addEventListener("htmx:beforeRequest", function (event) {
    if (targetsLogbook(event)) stepLoading = true;
  });
  document.addEventListener("htmx:afterRequest", function (event) {
    // A failed or aborted load swaps nothing: the presses counted for it are dropped.
    if (targetsLogbook(event) && !event.detail.successful) {
      stepLoading = false;
      pendingSteps = 0;
    }
  });
  document.addEventListener("htmx:afterSettle", function (event) {
    if (!stepLoading || !document.getElementById("logbook")) return;
    if (event.detail && event.detail.elt && event.detail.elt.hasAttribute &&
        event.detail.elt.hasAttribute("data-live-poll")) return;
    stepLoading = false;
    drainPending();
  });

  // After a jump to a sequence number, bring that message into view.
  function revealTarget() {
    var target = document.querySelector(".is-target");
    if (target && !target.dataset.revealed) {
      target.dataset.revealed = "1";
      target.scrollIntoView({ block: "center" });
    }
  }

  // A conversation opens where it is now: at its latest message (unless the address names
  // one, #m-<seq> or ?seq=, or the page shows an earlier stretch).
  function openAtLatest() {
    var list = document.querySelector("[data-open-at=latest]");
    if (!list || document.querySelector(".is-target")) return;
    if (location.hash && document.getElementById(location.hash.slice(1))) return;
    var messages = list.querySelectorAll("article.msg");
    if (messages.length) messages[messages.length - 1].scrollIntoView({ block: "end" });
  }

  // Copy buttons: data-copy="<selector>" copies that element's text, data-copy-text its value.
  function copyText(text, button) {
    function done(ok) {
      var label = button.dataset.label || button.textContent;
      button.dataset.label = label;
      button.textContent = ok ? "Copied" : "Select and copy";
      setTimeout(function () { button.textContent = label; }, 1500);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(function () { done(true); }, function () { done(false); });
      return;
    }
    // Plain-HTTP deployments have no clipboard API: fall back to a selected textarea.
    var area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.className = "copy-buffer";
    document.body.appendChild(area);
    area.select();
    var ok = false;
    try { ok = document.execCommand("copy"); } catch (e) { ok = false; }
    document.body.removeChild(area);
    done(ok);
  }

  document.addEventListener("click", function (event) {
    var copy = event.target.closest("[data-copy], [data-copy-text]");
    if (copy) {
      if (copy.hasAttribute("data-copy-text")) {
        copyText(copy.dataset.copyText, copy);
      } else {
        var source = document.querySelector(copy.dataset.copy);
        // A folded text copies in full, without its preview and toggle.
        var full = source && source.querySelector(".fold-full");
        if (source) copyText((full || source).textContent, copy);
      }
      return;
    }
    var opener = event.target.closest("[data-open-dialog]");
    if (opener) {
      var dialog = document.getElementById(opener.dataset.openDialog);
      if (dialog && !dialog.open) dialog.showModal();
    }
  });

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

  // A running run's timeline: one bar per step, carrying its numbers (data-s / data-e: offset
  // and end in seconds from the run's time zero, data-d duration, data-t tokens). Laid out here,
  // on the run's clock when steps are timed (else one slot per step), so a poll only appends
  // the new steps' bars. Tracks as in queries/logbook.Timeline: durations 48 high, tokens 32
  // high below them, in a 1000-wide picture.
  var TL = { width: 1000, dur: 48, tokBase: 54, tok: 32 };

  function layoutLiveTimeline() {
    var figure = document.querySelector("#run-timeline[data-live-timeline]");
    if (!figure) return;
    var bars = figure.querySelectorAll("#tl-bars > a");
    var span = 0, maxDur = 0, maxTok = 0, timed = false;
    bars.forEach(function (bar) {
      if (bar.dataset.s !== undefined) {
        timed = true;
        span = Math.max(span, Number(bar.dataset.e));
      }
      maxDur = Math.max(maxDur, Number(bar.dataset.d));
      maxTok = Math.max(maxTok, Number(bar.dataset.t));
    });
    var onClock = timed && span > 0;
    var slot = TL.width / Math.max(bars.length, 1);
    var previousEnd = 0;
    var centres = {};
    bars.forEach(function (bar, i) {
      var x, w;
      if (onClock && bar.dataset.s !== undefined) {
        x = Number(bar.dataset.s) / span * TL.width;
        w = Math.max((Number(bar.dataset.e) - Number(bar.dataset.s)) / span * TL.width, 1.5);
        previousEnd = x + w;
      } else if (onClock) {
        x = previousEnd; w = 1.5; // an untimed step (the task) where the previous one ended
      } else {
        x = i * slot; w = Math.max(slot * 0.8, 0.5);
      }
      var d = Number(bar.dataset.d), t = Number(bar.dataset.t);
      var dh = d ? Math.max(d / (maxDur || 1) * TL.dur, 1) : 0;
      var th = t ? Math.max(t / (maxTok || 1) * TL.tok, 1) : 0;
      var rects = bar.querySelectorAll("rect");
      setRect(rects[0], x, 0, w, TL.tokBase + TL.tok);
      setRect(rects[1], x, TL.dur - dh, w, dh);
      setRect(rects[2], x, TL.tokBase, w, th);
      centres[bar.dataset.p] = x + w / 2;
    });
    var marker = figure.querySelector(".tl-marker[data-p]");
    if (marker && centres[marker.dataset.p] !== undefined) {
      marker.setAttribute("x1", centres[marker.dataset.p].toFixed(2));
      marker.setAttribute("x2", centres[marker.dataset.p].toFixed(2));
    }
  }

  function setRect(rect, x, y, w, h) {
    if (!rect) return;
    rect.setAttribute("x", x.toFixed(2));
    rect.setAttribute("y", y.toFixed(2));
    rect.setAttribute("width", w.toFixed(2));
    rect.setAttribute("height", h.toFixed(2));
  }

  document.addEventListener("DOMContentLoaded", layoutLiveTimeline);
  document.addEventListener("htmx:afterSettle", layoutLiveTimeline);
  document.addEventListener("htmx:oobAfterSwap", layoutLiveTimeline);
  document.addEventListener("DOMContentLoaded", settle);
  document.addEventListener("DOMContentLoaded", openAtLatest);
  document.addEventListener("htmx:afterSettle", settle);

  // #flash shows errors the server sent there (HX-Retarget); answers htmx does not swap (a
  // proxy's 502, no network) get a message written here.
  function flash() { return document.getElementById("flash"); }

  function showFlash(text) {
    var region = flash();
    if (!region) return;
    var box = document.createElement("div");
    box.className = "flash-message error";
    box.setAttribute("role", "alert");
    var message = document.createElement("span");
    message.textContent = text;
    var close = document.createElement("button");
    close.type = "button";
    close.className = "btn small ghost";
    close.dataset.dismiss = "flash";
    close.setAttribute("aria-label", "Dismiss");
    close.textContent = "\u00d7";
    box.appendChild(message);
    box.appendChild(close);
    region.replaceChildren(box);
  }

  // Cleared once something the operator did succeeds (not by a list refreshing itself).
  document.addEventListener("htmx:afterRequest", function (event) {
    var region = flash();
    if (region && event.detail.successful && /^(FORM|BUTTON|A|INPUT|SELECT|TEXTAREA)$/.test(event.detail.elt.tagName)) {
      region.replaceChildren();
    }
  });
  document.addEventListener("htmx:responseError", function (event) {
    var status = event.detail.xhr.status;
    if (status >= 400 && status <= 500) return; // swapped: the answer says what went wrong
    showFlash("The server answered " + status + ". Reload the page to see where things stand.");
  });
  document.addEventListener("htmx:sendError", function () {
    showFlash("The server cannot be reached: check the connection and try again.");
  });
  // htmx skips a request from a form the browser finds invalid without a word: say why.
  document.addEventListener("htmx:validation:halted", function (event) {
    var form = event.detail.elt.closest("form") || event.detail.elt;
    if (form.reportValidity) form.reportValidity();
  });
  document.addEventListener("click", function (event) {
    var dismiss = event.target.closest('[data-dismiss="flash"]');
    if (dismiss) flash().replaceChildren();
  });

  // Runs table: say how many runs are picked for a comparison (the server checks it is two).
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box.matches || !box.matches('input[name="run"][form="compare-form"]')) return;
    var count = document.querySelector("[data-compare-count]");
    if (!count) return;
    var picked = document.querySelectorAll('input[name="run"][form="compare-form"]:checked').length;
    count.textContent = picked === 2 ? "Two runs picked: press Compare."
      : picked > 2 ? picked + " runs picked: a comparison takes two."
      : picked + " of 2 runs picked.";
  });
})();
