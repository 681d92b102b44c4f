"""StorageURL: the `--storage` URL, parsed once where the config is read.

`file:///dir` (or a plain directory path) is a local directory, `s3://bucket/prefix` a
bucket; everything that needs to know which (the backend factory, the S3 store, the flush
pacing default, the metrics label, the pipeline's metadata guess) asks this value.
"""

from __future__ import annotations

from dataclasses import dataclass

FILE, S3 = "file", "s3"


@dataclass(frozen=True, slots=True)
class StorageURL:
    scheme: str  # FILE or S3
    location: str  # FILE: the directory; S3: "bucket" or "bucket/prefix"
    text: str  # as given

    @classmethod
    def parse(cls, text: str) -> "StorageURL":
        """Raises ValueError for a scheme other than file:// and s3://."""
        if text.startswith("s3://"):
            return cls(S3, text[len("s3://") :], text)
        if text.startswith("file://"):
            return cls(FILE, text[len("file://") :], text)
        if "://" in text:
            raise ValueError(f"unsupported storage URL {text!r} (use file:// or s3://)")
        return cls(FILE, text, text)

    @property
    def is_s3(self) -> bool:
        return self.scheme == S3

    @property
    def bucket(self) -> str:
        return self.location.partition("/")[0]

    @property
    def prefix(self) -> str:
        return self.location.partition("/")[2]

    def __str__(self) -> str:
        return self.text
