/* Adds, above every <time class="instant" datetime="…Z"> (rendered in UTC by the server, see
   notifications/admin/time.py), the same instant in the viewer's own zone, to the millisecond:
   "2030-03-01 10:00:00.123 CET (your zone)", the IANA zone name in its tooltip. Nothing is added when the viewer's zone
   is UTC. */
(function () {
  "use strict";
  function pad(n, width) { return String(n).padStart(width || 2, "0"); }
  function local(date, zone) {
    var parts = {};
    new Intl.DateTimeFormat("en-GB", {
      timeZone: zone, hourCycle: "h23", year: "numeric", month: "2-digit", day: "2-digit",
      hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short"
    }).formatToParts(date).forEach(function (p) { parts[p.type] = p.value; });
    return parts.year + "-" + parts.month + "-" + parts.day + " " + parts.hour + ":" + parts.minute + ":" +
      parts.second + "." + pad(date.getUTCMilliseconds(), 3) + " " + parts.timeZoneName;
  }
  function show() {
    var zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
    if (!zone || zone === "UTC" || zone === "Etc/UTC") { return; }
    document.querySelectorAll("time.instant[datetime]").forEach(function (el) {
      if (el.dataset.localShown) { return; }
      var date = new Date(el.getAttribute("datetime"));
      if (isNaN(date.getTime())) { return; }
      var line = document.createElement("span");
      line.className = "instant-local";
      line.style.whiteSpace = "nowrap";
      line.title = "your zone: " + zone;
      line.textContent = local(date, zone) + " (your zone)";
      el.style.whiteSpace = "nowrap";
      el.parentNode.insertBefore(line, el);
      el.parentNode.insertBefore(document.createElement("br"), el);
      el.dataset.localShown = "1";
    });
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", show); } else { show(); }
})();
