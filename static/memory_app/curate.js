// Curation screens: "select all" (copy buttons are app.js's), the review inbox's keys. A file, not inline script (the CSP forbids it).
(function () {
  "use strict";

  document.addEventListener("click", function (event) {
    var all = event.target.closest("[data-select-all]");
    if (all) {
      var boxes = document.querySelectorAll('input[type=checkbox][form="' + all.dataset.selectAll + '"]');
      var anyOff = Array.prototype.some.call(boxes, function (b) { return !b.checked; });
      boxes.forEach(function (b) { b.checked = anyOff; });
    }
  });

  // The review inbox: j/k move between proposals, x selects, a/r/m press the focused proposal's
  // approve, reject and first merge buttons, e opens its editor. Typing in a field is left alone.
  function proposals() { return Array.prototype.slice.call(document.querySelectorAll("[data-inbox] .proposal")); }

  document.addEventListener("DOMContentLoaded", function () {
    var first = proposals()[0];
    if (first) { first.focus(); }
  });

  document.addEventListener("keydown", function (event) {
    if (!document.querySelector("[data-inbox]") || event.ctrlKey || event.metaKey || event.altKey) { return; }
    if (event.target.closest("input, textarea, select, [contenteditable]")) { return; }
    var all = proposals();
    var current = event.target.closest(".proposal");
    var at = all.indexOf(current);
    var key = event.key;
    if (key === "j" || key === "k") {
      var next = all[key === "j" ? Math.min(at + 1, all.length - 1) : Math.max(at - 1, 0)];
      if (next) { next.focus(); event.preventDefault(); }
      return;
    }
    if (!current) { return; }
    if (key === "x") {
      var box = current.querySelector('input[type=checkbox][name="ids"]');
      if (box) { box.checked = !box.checked; event.preventDefault(); }
    } else if (key === "e") {
      var editor = current.querySelector("[data-edit]");
      if (editor) { editor.open = true; editor.querySelector("textarea").focus(); event.preventDefault(); }
    } else if (key === "a" || key === "r" || key === "m") {
      var button = current.querySelector('[data-key="' + key + '"]');
      if (button) { button.click(); event.preventDefault(); }
    }
  });
})();
