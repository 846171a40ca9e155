/* The admin's charts (docs/CAMPAIGNS.md, "Pace"; docs/OPERATIONS.md, provider health): thin helpers
   over Chart.js (static/vendor/chartjs, served by WhiteNoise: no CDN). A page calls them with data the
   server already put in the page (json_script) and updates them with what its poll returns; without
   JavaScript the page's numbers stay as they are. */
(function () {
  "use strict";
  if (!window.Chart) { return; }
  var COLOURS = {sent: "#417690", delivered: "#2e7d32", failed: "#ba2121", suppressed: "#b8860b"};
  var NAMES = ["sent", "delivered", "failed", "suppressed"];

  function perMinute(canvas, data) {
    if (!canvas) { return null; }
    var chart = new window.Chart(canvas, {
      type: "line",
      data: {labels: data.labels, datasets: NAMES.map(function (name) {
        return {label: name + " / min", data: data[name], borderColor: COLOURS[name],
                backgroundColor: COLOURS[name], spanGaps: false, borderWidth: 2, tension: 0,
                // no dots on a line, but a lone minute (a short campaign) must still show
                pointRadius: function (ctx) { return ctx.chart.data.labels.length < 2 ? 3 : 0; }};
      })},
      options: {animation: false, responsive: true, interaction: {mode: "index", intersect: false},
                scales: {x: {title: {display: true, text: "minute (UTC)"}, ticks: {maxTicksLimit: 12}},
                         y: {beginAtZero: true, title: {display: true, text: "notifications per minute"}}},
                plugins: {legend: {position: "bottom"}}}
    });
    canvas.dataset.chartReady = "1";  // the browser tests wait for it
    return chart;
  }

  function update(chart, data) {
    chart.data.labels = data.labels;
    NAMES.forEach(function (name, i) { chart.data.datasets[i].data = data[name]; });
    chart.update("none");
  }

  var GROUP_COLOURS = {delivered: "#2e7d32", sent: "#417690", failed: "#ba2121", suppressed: "#b8860b",
                       "not sent": "#666666", pending: "#9e9e9e"};

  function stamp(ms) {
    return new Date(ms).toISOString().slice(0, 16).replace("T", " ") + " UTC";
  }

  /* A recipient's notifications as dots: x the instant, y the channel, colour the outcome group; the
     tooltip names status and reason. data: {points: [{t, channel, group, status, reason}], channels, groups}. */
  function timeline(canvas, data) {
    if (!canvas) { return null; }
    var row = {};
    data.channels.forEach(function (c, i) { row[c] = i; });
    var chart = new window.Chart(canvas, {
      type: "scatter",
      data: {datasets: data.groups.map(function (group) {
        return {label: group, backgroundColor: GROUP_COLOURS[group] || "#999", pointRadius: 4,
                data: data.points.filter(function (p) { return p.group === group; })
                  .map(function (p) { return {x: p.t, y: row[p.channel], point: p}; })};
      })},
      options: {animation: false, responsive: true,
                // A grid line at each UTC midnight (days readable, "this week" countable), labelled as
                // room allows; a linear scale's own ticks fell at odd instants (hadv34 #10).
                scales: {x: {type: "linear", min: data.since, max: data.until,
                             afterBuildTicks: function (axis) {
                               var day = 86400000, ticks = [];
                               for (var t = Math.ceil(data.since / day) * day; t <= data.until; t += day) {
                                 ticks.push({value: t});
                               }
                               axis.ticks = ticks;
                             },
                             ticks: {callback: function (v) { return stamp(v).slice(5, 10); }, autoSkip: true,
                                     maxRotation: 0}},
                         // One tick per channel row, at its integer (a linear scale starting at -0.5
                         // would put its ticks between the rows, each unlabelled: hadv34 #2).
                         y: {min: -0.5, max: data.channels.length - 0.5, reverse: true,
                             afterBuildTicks: function (axis) {
                               axis.ticks = data.channels.map(function (c, i) { return {value: i}; });
                             },
                             ticks: {autoSkip: false, callback: function (v) { return data.channels[v] || ""; }}}},
                plugins: {legend: {position: "bottom"},
                          tooltip: {callbacks: {label: function (item) {
                            var p = item.raw.point;
                            return stamp(p.t) + " · " + p.channel + " · " + p.status + (p.reason ? ": " + p.reason : "");
                          }}}}}
    });
    canvas.dataset.chartReady = "1";
    return chart;
  }

  /* One small per-minute series (the provider health page's last hour): a line, or with opts.breaker
     a stepped closed (0) / open (1) band; null is a minute without a sample (a gap). */
  function small(canvas, labels, values, opts) {
    if (!canvas) { return null; }
    var colour = opts.breaker ? "#ba2121" : "#417690";
    var y = {beginAtZero: true, ticks: {maxTicksLimit: 4}};
    if (opts.breaker) {
      y = {min: 0, max: 1, ticks: {stepSize: 1, callback: function (v) { return v ? "open" : "closed"; }}};
    }
    var chart = new window.Chart(canvas, {
      type: "line",
      data: {labels: labels, datasets: [{label: opts.title, data: values, borderColor: colour,
        backgroundColor: opts.breaker ? "rgba(186,33,33,0.25)" : colour, fill: !!opts.breaker,
        stepped: !!opts.breaker, spanGaps: false, pointRadius: 0, borderWidth: 1.5, tension: 0}]},
      options: {animation: false, responsive: true, maintainAspectRatio: false,  // the box's height
                interaction: {mode: "index", intersect: false},
                scales: {x: {ticks: {maxTicksLimit: 4, maxRotation: 0}}, y: y},
                plugins: {legend: {display: false}, title: {display: true, text: opts.title}}}
    });
    canvas.dataset.chartReady = "1";
    return chart;
  }

  window.notifyCharts = {perMinute: perMinute, update: update, timeline: timeline, small: small};
})();
