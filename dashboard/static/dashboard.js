// leasehold dashboard: refreshes every table from its JSON API without a full
// reload, and ticks countdowns and ages between refreshes.
//
// Cells are built with textContent and createElement only: stream ids and
// owners are untrusted text and must never become markup. The formatting here
// mirrors dashboard/src/web/column.rs (the server's first render).
(function () {
  'use strict';
  var body = document.body;
  var refreshMs = Number(body.dataset.refreshMs) || 2000;
  var serverNow = Number(body.dataset.serverNow) || Date.now();
  var offset = serverNow - Date.now();
  var NONE = '\u2014';

  function now() { return Date.now() + offset; }

  function duration(ms) {
    ms = Math.max(0, Math.round(ms));
    if (ms < 1000) return ms + ' ms';
    var secs = Math.floor(ms / 1000);
    if (secs < 60) return (ms / 1000).toFixed(1) + ' s';
    if (secs < 3600) return Math.floor(secs / 60) + ' m ' + (secs % 60) + ' s';
    if (secs < 86400) return Math.floor(secs / 3600) + ' h ' + Math.floor((secs % 3600) / 60) + ' m';
    return Math.floor(secs / 86400) + ' d ' + Math.floor((secs % 86400) / 3600) + ' h';
  }

  function countdown(left) {
    return left >= 0 ? 'in ' + duration(left) : duration(-left) + ' ago';
  }

  function field(row, path) {
    return path.split('.').reduce(function (value, key) {
      return value === null || value === undefined ? null : value[key];
    }, row);
  }

  // A data gap's tooltip, as dashboard/src/gaps.rs writes it.
  function gapText(gap) {
    var events = gap.missing === 1 ? 'event' : 'events';
    return 'seq ' + gap.from_seq + '\u2013' + gap.to_seq + ' missing (' + gap.missing + ' ' + events + '): ' + gap.reason;
  }

  function safeClass(text) { return String(text).replace(/[^a-z0-9_-]/gi, ''); }

  function cell(kind, value, at) {
    var td = document.createElement('td');
    if (value === null || value === undefined) { td.textContent = NONE; return td; }
    switch (kind) {
      case 'badge': {
        var span = document.createElement('span');
        var label = typeof value === 'boolean' ? (value ? 'yes' : 'no') : String(value);
        var cls = typeof value === 'boolean' ? (value ? 'up' : 'down') : label;
        span.className = 'badge badge-' + safeClass(cls);
        span.textContent = label;
        td.appendChild(span);
        return td;
      }
      case 'seconds': td.textContent = Number(value).toFixed(1) + ' s'; return td;
      case 'countdown':
        if (!value) { td.textContent = NONE; return td; }
        td.dataset.at = value;
        td.textContent = countdown(value - at);
        return td;
      case 'ago':
        if (!(value > 0)) { td.textContent = NONE; return td; }
        td.dataset.at = value;
        td.textContent = duration(at - value) + ' ago';
        return td;
      case 'age_ms': td.textContent = duration(value); return td;
      case 'gap':
        if (!(value.at_ms > 0)) { td.textContent = NONE; return td; }
        td.dataset.at = value.at_ms;
        td.title = gapText(value);
        td.textContent = duration(at - value.at_ms) + ' ago';
        return td;
      case 'status_link': {
        var url = String(value) + '/status';
        var a = document.createElement('a');
        if (/^https?:\/\//.test(url)) a.href = url;
        a.textContent = url;
        td.appendChild(a);
        return td;
      }
      case 'stream_link': {
        var link = document.createElement('a');
        link.href = '/streams/' + encodeURIComponent(String(value));
        link.textContent = String(value);
        td.appendChild(link);
        return td;
      }
      case 'tokens':
        td.textContent = value.map(function (p) { return p[0] + ':' + p[1]; }).join(', ');
        return td;
      default:
        td.textContent = String(value);
        return td;
    }
  }

  function columns(table) {
    return Array.prototype.map.call(table.querySelectorAll('thead th'), function (th) {
      return { field: th.dataset.field, kind: th.dataset.kind };
    });
  }

  function fill(table, rows, at) {
    var cols = columns(table);
    var tbody = document.createElement('tbody');
    rows.forEach(function (row) {
      var tr = document.createElement('tr');
      cols.forEach(function (c) { tr.appendChild(cell(c.kind, field(row, c.field), at)); });
      tbody.appendChild(tr);
    });
    if (rows.length === 0) {
      var tr = document.createElement('tr');
      tr.className = 'empty';
      var td = document.createElement('td');
      td.colSpan = cols.length;
      td.textContent = table.dataset.empty || '';
      tr.appendChild(td);
      tbody.appendChild(tr);
    }
    table.replaceChild(tbody, table.tBodies[0]);
  }

  function showSources(sources, failure) {
    var box = document.getElementById('sources');
    if (!box) return;
    while (box.firstChild) box.removeChild(box.firstChild);
    (sources || []).forEach(function (s) {
      if (s.ok) return;
      var p = document.createElement('p');
      p.className = 'source-down';
      p.dataset.source = s.name;
      var b = document.createElement('b');
      b.textContent = s.name + ' unavailable:';
      p.appendChild(b);
      var since = s.last_ok_ms ? 'showing data from ' + duration(now() - s.last_ok_ms) + ' ago' : 'no data yet';
      p.appendChild(document.createTextNode(' ' + (s.error || 'unavailable') + ' \u2014 ' + since));
      box.appendChild(p);
    });
    if (failure) {
      var p = document.createElement('p');
      p.className = 'source-down';
      p.textContent = 'Refresh failed: ' + failure + ' (showing the last data received).';
      box.appendChild(p);
    }
  }

  function showCounts(counts) {
    if (!counts) return;
    document.querySelectorAll('#counts [data-state]').forEach(function (a) {
      var b = a.querySelector('b');
      if (b) b.textContent = String(counts[a.dataset.state] || 0);
    });
  }

  // Conditional GET: the server tags every view and API with the snapshot it
  // came from; a request carrying that tag gets 304 and no body. Responses are
  // no-store, so the script keeps the last body per URL itself.
  var cache = {};

  function getConditional(url, accept, parse) {
    var headers = { Accept: accept };
    var cached = cache[url];
    if (cached) headers['If-None-Match'] = cached.etag;
    return fetch(url, { credentials: 'same-origin', cache: 'no-store', headers: headers })
      .then(function (response) {
        if (response.status === 304 && cached) {
          body.dataset.notModified = String(Number(body.dataset.notModified || 0) + 1);
          return { fresh: false, value: cached.value };
        }
        if (!response.ok) throw new Error('HTTP ' + response.status);
        return parse(response).then(function (value) {
          var etag = response.headers.get('ETag');
          if (etag) cache[url] = { etag: etag, value: value };
          return { fresh: true, value: value };
        });
      });
  }

  function getJson(url) {
    return getConditional(url, 'application/json', function (r) { return r.json(); })
      .then(function (got) { return got.value; });
  }

  // Pages drawn server-side (timeline, trends, one stream) mark their changing
  // part with data-live; a newer snapshot replaces it with the server's render
  // of the same element (escaped by askama), unless keyboard focus is inside.
  function refreshLive() {
    var regions = document.querySelectorAll('[data-live][id]');
    if (regions.length === 0) return Promise.resolve();
    var url = location.pathname + location.search;
    return getConditional(url, 'text/html', function (r) { return r.text(); })
      .then(function (got) {
        if (!got.fresh) return;
        var doc = new DOMParser().parseFromString(got.value, 'text/html');
        regions.forEach(function (region) {
          if (region.contains(document.activeElement) && document.activeElement !== document.body) return;
          var next = doc.getElementById(region.id);
          if (next) region.replaceWith(document.importNode(next, true));
        });
        var stamp = doc.body && doc.body.dataset.serverNow;
        if (stamp) { serverNow = Number(stamp); offset = serverNow - Date.now(); }
        body.dataset.updates = String(Number(body.dataset.updates || 0) + 1);
      });
  }

  function refresh() {
    var tables = Array.prototype.slice.call(document.querySelectorAll('table[data-api]'));
    var apis = {};
    tables.forEach(function (t) { apis[t.dataset.api] = true; });
    if (!apis['/api/streams']) apis['/api/streams?per_page=1'] = true;
    var query = location.search;
    refreshLive().catch(function (err) { showSources([], err.message); });
    Promise.all(Object.keys(apis).map(function (api) {
      var url = api === '/api/streams' ? api + query : api;
      return getJson(url).then(function (json) { return [api, json]; });
    })).then(function (results) {
      var sources = null;
      results.forEach(function (result) {
        var api = result[0], json = result[1];
        if (json.taken_at_ms) {
          serverNow = json.taken_at_ms;
          offset = serverNow - Date.now();
        }
        if (json.sources) sources = json.sources;
        if (json.counts) showCounts(json.counts);
        tables.filter(function (t) { return t.dataset.api === api; }).forEach(function (t) {
          fill(t, field(json, t.dataset.rows) || [], serverNow);
        });
        if (api === '/api/streams') {
          var summary = document.getElementById('streams-summary');
          if (summary) summary.textContent = json.total + ' streams match; page ' + json.page + ' of ' + json.pages + '.';
        }
      });
      showSources(sources, null);
      body.dataset.refreshed = String(Date.now());
      body.dataset.refreshes = String(Number(body.dataset.refreshes || 0) + 1);
    }).catch(function (err) {
      showSources([], err.message);
    });
  }

  // Column kinds are read once per table, not once per cell: a 10,000-row page
  // ticks 20,000 cells every second.
  function tick() {
    var t = now();
    document.querySelectorAll('table[data-api]').forEach(function (table) {
      var ticking = [];
      table.querySelectorAll('thead th').forEach(function (th, i) {
        var kind = th.dataset.kind;
        if (kind === 'countdown' || kind === 'ago' || kind === 'gap') ticking.push([i, kind]);
      });
      if (ticking.length === 0 || !table.tBodies[0]) return;
      var rows = table.tBodies[0].rows;
      for (var r = 0; r < rows.length; r++) {
        for (var c = 0; c < ticking.length; c++) {
          var td = rows[r].cells[ticking[c][0]];
          if (!td || !td.dataset.at) continue;
          var at = Number(td.dataset.at);
          td.textContent = ticking[c][1] === 'countdown' ? countdown(at - t) : duration(t - at) + ' ago';
        }
      }
    });
    var age = document.getElementById('snapshot-age');
    if (age) age.textContent = duration(Date.now() + offset - serverNow) + ' old';
  }

  // Layout self-check after every render: whether the page fits the window
  // without horizontal scrolling (the browser test reads it from the DOM).
  function checkFit() {
    var root = document.documentElement;
    body.dataset.fits = String(root.scrollWidth <= root.clientWidth);
  }

  checkFit();
  setInterval(checkFit, 1000);
  setInterval(refresh, refreshMs);
  setInterval(tick, 1000);
})();
