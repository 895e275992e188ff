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

    def visit(self, url: str, wait_s: float, script: str) -> tuple[object, bytes]:
        """Open ``url``, wait ``wait_s`` seconds, evaluate ``script``; returns (value, PNG bytes)."""
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/json/new?{url}", method="PUT")
        target = json.loads(urllib.request.urlopen(req, timeout=30).read())
        return asyncio.run(self._drive(target["webSocketDebuggerUrl"], wait_s, script))

    async def _drive(self, ws_url: str, wait_s: float, script: str):
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

        await asyncio.sleep(wait_s)
        value = await call("Runtime.evaluate", expression=script, returnByValue=True)
        shot = await call("Page.captureScreenshot", format="png")
        ws.close()
        return value["result"].get("value"), base64.b64decode(shot["data"])

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=30)
