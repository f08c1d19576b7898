/* The console's line charts, drawn with uPlot (static/vendor/uplot/).

   Each chart is an element [data-chart="ID"] beside a JSON script element
   #ID that console/charts.py writes: {zone, times (Unix seconds), series:
   [{name, label, values}], thresholds: [{name, label, value}]}. Each
   threshold is a dashed line across the chart in its line's colour. The time axis and the legend's time are told in
   `zone`, the user's time zone; the legend shows each line's value under the
   pointer (its total or current count stays in the caption). A line takes
   the colour its caption's entry has (static/css/console.css). Charts that
   htmx swaps in (the queue page's hour and day) are drawn as they arrive. */
(function () {
  'use strict';
  if (typeof uPlot === 'undefined') return;

  var HEIGHT = 170;
  var numbers = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });

  function colourOf (figure, name) {
    var entry = figure.querySelector('figcaption .' + CSS.escape(name));
    return entry ? getComputedStyle(entry).color : 'currentColor';
  }

  var clock = uPlot.fmtDate('{HH}:{mm}');
  var day = uPlot.fmtDate('{MMM} {D}');

  /* The time axis's labels: hours and minutes in the user's zone, and the
     date where it changes. The host keeps them (data-time-ticks) for the
     reader that cannot see the canvas, and for the browser tests. */
  function timeTicks (host, ticks, zone) {
    var previous = null;
    var labels = ticks.map(function (ts) {
      var date = uPlot.tzDate(new Date(ts * 1e3), zone);
      var label = clock(date);
      if (previous !== null && day(date) !== previous) label = day(date) + '\n' + label;
      previous = day(date);
      return label;
    });
    host.dataset.timeTicks = labels.join(' ').replace(/\n/g, ' ');
    return labels;
  }

  function draw (host) {
    if (host.dataset.drawn) return;
    var source = document.getElementById(host.dataset.chart);
    if (!source) return;
    var chart = JSON.parse(source.textContent);
    var figure = host.closest('figure') || host;
    var series = [{
      label: 'Time',
      value: '{YYYY}-{MM}-{DD} {HH}:{mm}'
    }];
    var data = [chart.times];
    chart.series.forEach(function (line) {
      series.push({
        label: line.label,
        stroke: colourOf(figure, line.name),
        width: 2,
        points: { show: false },
        value: function (u, value) { return value == null ? '–' : numbers.format(value); }
      });
      data.push(line.values);
    });
    (chart.thresholds || []).forEach(function (threshold) {
      series.push({
        label: threshold.label,
        stroke: colourOf(figure, threshold.name),
        width: 1,
        dash: [6, 4],
        points: { show: false },
        value: function () { return numbers.format(threshold.value); }
      });
      data.push(chart.times.map(function () { return threshold.value; }));
    });
    host.dataset.drawn = 'true';
    var plot = new uPlot({
      width: Math.max(280, host.clientWidth || 560),
      height: HEIGHT,
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), chart.zone); },
      series: series,
      scales: { y: { range: function (u, min, max) { return [0, Math.max(1, max)]; } } },
      axes: [
        { values: function (u, ticks) { return timeTicks(host, ticks, chart.zone); } },
        { values: function (u, ticks) { return ticks.map(function (t) { return numbers.format(t); }); } }
      ],
      cursor: { points: { size: 6 } }
    }, data, host);
    host.uplot = plot;
  }

  function drawWithin (root) {
    root.querySelectorAll('[data-chart]').forEach(draw);
  }

  function resize () {
    document.querySelectorAll('[data-chart]').forEach(function (host) {
      if (host.uplot) host.uplot.setSize({ width: Math.max(280, host.clientWidth), height: HEIGHT });
    });
  }

  document.addEventListener('DOMContentLoaded', function () { drawWithin(document); });
  document.addEventListener('htmx:afterSettle', function (event) { drawWithin(event.detail.elt); });
  window.addEventListener('resize', resize);
})();
