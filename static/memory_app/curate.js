// Curation screens: "select all" (copy buttons are app.js's). A file, not inline script (the CSP forbids it).
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
})();
