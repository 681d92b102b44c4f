// KafScale console: charts (uPlot) fed by JSON endpoints, refreshed every few seconds.
// Everything else is server-rendered HTML, enhanced by htmx attributes.
(function () {
  "use strict";
  var REFRESH_MS = 5000;
  var COLORS = ["#2456c9", "#1e7b45", "#a66300", "#b42318", "#6b46c1"];

  function makeChart(el, keys) {
    var title = document.createElement("div");
    title.className = "title";
    title.textContent = el.getAttribute("data-title") || "";
    el.appendChild(title);
    var series = [{}];
    keys.forEach(function (k, i) {
      // A p50 and its p99 share a colour; the p99 is dashed.
      var color = /_p(50|99)$/.test(k) ? COLORS[Math.floor(i / 2) % COLORS.length] : COLORS[i % COLORS.length];
      series.push({ label: k.replace(/_/g, " "), stroke: color, width: 2, spanGaps: true, dash: /_p99$/.test(k) ? [6, 4] : undefined });
    });
    var opts = { width: Math.max(el.clientWidth - 16, 280), height: 180, series: series, axes: [{}, { size: 60 }], legend: { live: false } };
    var empty = [[]].concat(keys.map(function () { return []; }));
    var plot = new uPlot(opts, empty, el);
    el.uplot = plot;  // what the chart shows, for the browser tests
    return plot;
  }

  function start(container) {
    var url = container.getAttribute("data-charts");
    var charts = [];
    container.querySelectorAll(".chart").forEach(function (el) {
      var keys = el.getAttribute("data-series").split(",");
      charts.push({ keys: keys, plot: makeChart(el, keys) });
    });
    function refresh() {
      fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
        .then(function (r) { return r.ok ? r.json() : null; })
        .then(function (data) {
          if (!data) { return; }
          charts.forEach(function (c) {
            c.plot.setData([data.t].concat(c.keys.map(function (k) { return data[k] || []; })));
          });
        })
        .catch(function () { /* the console or the cluster is away: the next round retries */ });
    }
    refresh();
    setInterval(refresh, REFRESH_MS);
  }

  function init() {
    if (typeof uPlot === "undefined") { return; }
    document.querySelectorAll("[data-charts]").forEach(start);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
})();
