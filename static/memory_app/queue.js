// Review queue: a digit scores the run on screen (and moves on), c writes a comment sent with
// the score, s or n skips to the next run, o opens the run's logbook. Presses while a score is
// on its way are dropped: they would land on the run already scored.
(function () {
  "use strict";

  function isTyping(el) {
    return !!el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));
  }

  document.addEventListener("keydown", function (event) {
    var item = document.getElementById("queue-item");
    if (!item) return;
    if (event.key === "Escape" && isTyping(event.target)) {
      event.target.blur();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey || isTyping(event.target)) return;
    var form = item.querySelector("form.queue-score");
    if (/^[0-9]$/.test(event.key)) {
      var button = form && form.querySelector('button[data-key="' + event.key + '"]');
      if (!button) return;
      event.preventDefault();
      if (form.classList.contains("htmx-request")) return;
      button.click();
    } else if (event.key === "c") {
      var comment = document.getElementById("queue-comment");
      if (!comment) return;
      event.preventDefault();
      comment.focus();
    } else if (event.key === "s" || event.key === "n") {
      var skip = item.querySelector('[data-queue="skip"]');
      if (!skip) return;
      event.preventDefault();
      skip.click();
    } else if (event.key === "o") {
      var open = item.querySelector('[data-queue="open"]');
      if (!open) return;
      event.preventDefault();
      open.click();
    }
  });
})();
