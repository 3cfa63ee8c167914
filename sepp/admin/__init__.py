"""The admin HTTP front (issue 15): an aiohttp listener in the server's own event
loop serving /metrics, /livez and /readyz (app.py) over the service layer."""
