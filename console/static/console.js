// The console's one script: every element with data-live="URL" shows the newest rendering of
// its part of the page, sent by the server as server-sent events (console/live.py). The
// rendering is the server's own escaped HTML.
"use strict";
for (const element of document.querySelectorAll("[data-live]")) {
  const source = new EventSource(element.dataset.live);
  source.addEventListener("update", (event) => {
    element.innerHTML = event.data;
    element.dataset.updates = String(Number(element.dataset.updates || "0") + 1);
  });
  source.addEventListener("ended", () => {
    source.close();
    window.location.assign("/login");
  });
}
