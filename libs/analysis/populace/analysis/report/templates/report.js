// Draws the figures from their JSON and pages the long tables (with a filter where there is a
// search box). Everything the page needs is in the page: no request leaves it.
(function () {
  "use strict";
  var CONFIG = {displaylogo: false, responsive: true};

  function drawFigures() {
    if (!window.Plotly) { return; }
    document.querySelectorAll(".plot[data-figure]").forEach(function (el) {
      var figure = JSON.parse(el.getAttribute("data-figure"));
      window.Plotly.newPlot(el, figure.data, figure.layout, CONFIG);
    });
  }

  // digits only: that agent's rows; anything else: rows whose text contains it (any case)
  function matches(row, query) {
    if (!query) { return true; }
    if (/^\d+$/.test(query)) { return row.getAttribute("data-agent") === query; }
    return row.textContent.toLowerCase().indexOf(query) >= 0;
  }

  function pageTable(box) {
    var size = parseInt(box.getAttribute("data-page-size"), 10) || 50;
    var rows = Array.prototype.slice.call(box.querySelectorAll("tbody tr"));
    var search = box.querySelector("input[type=search]");
    var prev = box.querySelector("button.prev");
    var next = box.querySelector("button.next");
    var label = box.querySelector(".page-label");
    var shown = rows;
    var page = 0;

    function render() {
      var pages = Math.max(1, Math.ceil(shown.length / size));
      page = Math.min(Math.max(page, 0), pages - 1);
      rows.forEach(function (row) { row.hidden = true; });
      shown.slice(page * size, (page + 1) * size).forEach(function (row) { row.hidden = false; });
      label.textContent = "page " + (page + 1) + " of " + pages + " (" + shown.length + " of " + rows.length +
        " rows)";
      prev.disabled = page === 0;
      next.disabled = page >= pages - 1;
    }

    prev.addEventListener("click", function () { page -= 1; render(); });
    next.addEventListener("click", function () { page += 1; render(); });
    if (search) {
      search.addEventListener("input", function () {
        var query = search.value.trim().toLowerCase();
        shown = rows.filter(function (row) { return matches(row, query); });
        page = 0;
        render();
      });
    }
    box.classList.add("paged-ready");
    render();
  }

  document.querySelectorAll(".paged").forEach(pageTable);
  drawFigures();
})();
