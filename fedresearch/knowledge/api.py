"""The Dify External Knowledge API's request, as Dify sends it to POST /retrieval."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fedresearch.knowledge.conditions import MetadataCondition


class RetrievalSetting(BaseModel):
    model_config = ConfigDict(extra="ignore")

    top_k: int | None = Field(None, ge=1, le=100)
    score_threshold: float | None = Field(0.0, ge=0.0, le=1.0)


class RetrievalRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    knowledge_id: str
    query: str
    retrieval_setting: RetrievalSetting = Field(default_factory=RetrievalSetting)
    metadata_condition: MetadataCondition | None = None

    @field_validator("retrieval_setting", mode="before")
    @classmethod
    def _null_setting(cls, value: object) -> object:
        return {} if value is None else value

    @property
    def is_probe(self) -> bool:
        """What Dify sends when a user registers the endpoint."""
        return not self.knowledge_id.strip() and not self.query.strip()
