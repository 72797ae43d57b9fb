// PARFusion dashboard: the page's only script besides htmx (the Content-Security-Policy allows
// scripts from this origin only, no inline script, no eval).
//
// Panels poll with hx-trigger="every Ns, visibilitychange from:document"; polling pauses while
// the tab is hidden. htmx's trigger filters ([document.visibilityState === 'visible']) would
// need eval, so the check is this listener: a request from a polling panel is cancelled while
// the document is hidden, and the visibilitychange trigger refreshes it when it shows again.
document.addEventListener("htmx:confirm", function (evt) {
  var elt = evt.target;
  if (document.visibilityState !== "visible" && elt && elt.hasAttribute && elt.hasAttribute("data-poll")) {
    evt.preventDefault();
  }
});

// What-if sliders show their value in the <output> next to them (was an inline oninput).
document.addEventListener("input", function (evt) {
  var slider = evt.target;
  if (slider && slider.hasAttribute && slider.hasAttribute("data-echo")) {
    var shown = slider.nextElementSibling;
    if (shown) {
      shown.value = slider.value;
    }
  }
});
