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
})();
