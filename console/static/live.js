// Live updates of the task page: on an event "changed" of /events?task=ID the page is fetched again and its
// #live fragment swapped. Without JavaScript the page is complete as served; reloading shows the same.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live || !window.EventSource) { return; }
  var task = live.getAttribute("data-task");
  var busy = false, again = false;
  function refresh() {
    if (busy) { again = true; return; }
    busy = true;
    fetch(window.location.href, { headers: { "Accept": "text/html" } })
      .then(function (r) { return r.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("live");
        var current = document.getElementById("live");
        if (fresh && current) { current.replaceWith(fresh); }
      })
      .catch(function () {})
      .then(function () { busy = false; if (again) { again = false; refresh(); } });
  }
  var source = new EventSource("/events?task=" + encodeURIComponent(task));
  source.addEventListener("changed", refresh);
})();
