// nsqadmin: a little JavaScript on top of pages that work without it.
// - an "auto-refresh" toggle (remembered) that reloads the page every 5 s, except while
//   the user is typing in a form;
// - the Counter page counts live from /api/counter.
(function () {
  "use strict";

  var REFRESH_MS = 5000;
  var KEY = "nsqadmin.autorefresh";

  function setUpRefresh() {
    var slot = document.getElementById("refresh-slot");
    var page = document.body.getAttribute("data-page");
    if (!slot || !page || page === "counter") {
      return;
    }
    var label = document.createElement("label");
    var box = document.createElement("input");
    box.type = "checkbox";
    box.id = "auto-refresh";
    box.checked = window.localStorage.getItem(KEY) === "on";
    label.appendChild(box);
    label.appendChild(document.createTextNode(" auto-refresh"));
    slot.appendChild(label);
    var timer = null;
    function schedule() {
      if (timer) {
        window.clearTimeout(timer);
        timer = null;
      }
      if (box.checked) {
        timer = window.setTimeout(function () {
          var active = document.activeElement;
          if (active && (active.tagName === "INPUT" || active.tagName === "TEXTAREA") && active.type !== "checkbox") {
            schedule();
            return;
          }
          // Reload without a one-time flash message.
          var url = window.location.pathname;
          window.location.replace(url);
        }, REFRESH_MS);
      }
    }
    box.addEventListener("change", function () {
      window.localStorage.setItem(KEY, box.checked ? "on" : "off");
      schedule();
    });
    schedule();
  }

  function setUpCounter() {
    var counter = document.getElementById("counter");
    if (!counter) {
      return;
    }
    var valueEl = document.getElementById("counter-value");
    var rateEl = document.getElementById("counter-rate");
    var api = counter.getAttribute("data-api");
    var last = null;
    function show(total) {
      valueEl.textContent = total.toLocaleString("en-US");
      valueEl.setAttribute("data-value", String(total));
    }
    function poll() {
      var request = new XMLHttpRequest();
      request.open("GET", api);
      request.onload = function () {
        if (request.status === 200) {
          var stats = JSON.parse(request.responseText).stats || {};
          var total = 0;
          Object.keys(stats).forEach(function (key) {
            total += stats[key].message_count;
          });
          var now = Date.now();
          if (last && now > last.at) {
            var rate = Math.max(total - last.total, 0) / ((now - last.at) / 1000);
            rateEl.textContent = rate.toFixed(1) + " messages/s";
          }
          last = {total: total, at: now};
          show(total);
        }
        window.setTimeout(poll, 1000);
      };
      request.onerror = function () {
        window.setTimeout(poll, 2000);
      };
      request.send();
    }
    poll();
  }

  setUpRefresh();
  setUpCounter();
})();
