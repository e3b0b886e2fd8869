// Curation screens: copy buttons and "select all". A file, not inline script (the CSP forbids it).
(function () {
  "use strict";

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
    var copy = event.target.closest("[data-copy]");
    if (copy) {
      var source = document.querySelector(copy.dataset.copy);
      if (source) copyText(source.textContent, copy);
      return;
    }
    var all = event.target.closest("[data-select-all]");
    if (all) {
      var boxes = document.querySelectorAll('input[type=checkbox][form="' + all.dataset.selectAll + '"]');
      var anyOff = Array.prototype.some.call(boxes, function (b) { return !b.checked; });
      boxes.forEach(function (b) { b.checked = anyOff; });
    }
  });
})();
