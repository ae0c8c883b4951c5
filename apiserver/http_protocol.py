"""uvicorn's httptools protocol with a bound on the request line and headers: 431 past MAX_HEAD_BYTES.

uvicorn's httptools protocol buffers a request's head, however long, until it ends: a client could send a
header of gigabytes and the body limit (apiserver/body_limit.py) would never see it. This subclass counts
what arrives while a head is incomplete and answers 431 once it passes the bound, closing the connection.
The count may miss one read's worth of bytes (the read that starts a request), so the memory a head can
take is bounded by MAX_HEAD_BYTES plus one read.
"""

from __future__ import annotations

import msgspec
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from apiserver.errors import ErrorBody, ErrorDetail

# Request line and headers together. Browsers, proxies and servers settle around 8 to 64 KiB (nginx reads
# 4 x 8 KiB, Node 16 KiB); a bearer key and a few cookies fit many times over.
MAX_HEAD_BYTES = 64 * 1024

TOO_LARGE = msgspec.json.encode(
    ErrorBody(
        ErrorDetail(
            f"The request line and headers are larger than this server's limit of {MAX_HEAD_BYTES} bytes.",
            "invalid_request_error",
            None,
            "headers_too_large",
        )
    )
)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    is_reading_head = True
    head_bytes = 0

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.is_reading_head = True
        self.head_bytes = 0

    def on_headers_complete(self) -> None:
        self.is_reading_head = False
        super().on_headers_complete()

    def data_received(self, data: bytes) -> None:
        if self.is_reading_head:
            self.head_bytes += len(data)
        super().data_received(data)
        if self.is_reading_head and self.head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self.send_431_response()

    def send_431_response(self) -> None:
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(TOO_LARGE), TOO_LARGE)
        )
        self.transport.close()
