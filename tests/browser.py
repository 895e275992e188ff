"""A headless Chromium driven over the DevTools protocol (tornado's websocket client; no extra
packages): open a page, let its websockets run, read values from its JavaScript, screenshot it."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import subprocess
import time
import urllib.request

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


class Browser:
    def __init__(self, chromium: str, profile_dir, size=(1400, 1200)):
        self.proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={profile_dir}", f"--window-size={size[0]},{size[1]}",
             "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        self.port = None
        deadline = time.time() + 60
        while self.port is None and time.time() < deadline:
            line = self.proc.stderr.readline()
            m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
            if m:
                self.port = int(m.group(1))
            elif not line and self.proc.poll() is not None:
                break
        if self.port is None:
            self.close()
            raise RuntimeError("chromium did not start its DevTools endpoint")

    def visit(self, url: str, script: str, ready, cap_s: float = 240.0) -> tuple[object, bytes]:
        """Open ``url``; evaluate ``script`` and take a screenshot again and again until
        ``ready(value, png)`` holds (what the page must show: no fixed wait, so a busy machine
        only makes it slower), or ``cap_s`` passed (only a hang waits that long); returns the last
        (value, PNG bytes)."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?{url}", method="PUT")
        target = json.loads(urllib.request.urlopen(req, timeout=30).read())
        return asyncio.run(self._drive(target["webSocketDebuggerUrl"], script, ready, cap_s))

    async def _drive(self, ws_url: str, script: str, ready, cap_s: float):
        import time

        from tornado.websocket import websocket_connect

        ws = await websocket_connect(ws_url, max_message_size=256 * 2**20)
        ids = iter(range(1, 10**6))

        async def call(method, **params):
            i = next(ids)
            ws.write_message(json.dumps({"id": i, "method": method, "params": params}))
            while True:
                msg = json.loads(await ws.read_message())
                if msg.get("id") == i:
                    if "error" in msg:
                        raise RuntimeError(f"{method}: {msg['error']}")
                    return msg["result"]

        deadline = time.monotonic() + cap_s
        while True:
            value = (await call("Runtime.evaluate", expression=script, returnByValue=True))["result"].get("value")
            png = base64.b64decode((await call("Page.captureScreenshot", format="png"))["data"])
            if ready(value, png) or time.monotonic() > deadline:
                ws.close()
                return value, png
            await asyncio.sleep(0.5)

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=30)
