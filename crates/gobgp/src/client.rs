//! A gRPC client of a GoBGP speaker, over the Unix socket its API listens on
//! (`gobgpd --api-hosts unix://PATH`). Async: it runs on the EVPN agent's one-thread
//! runtime. Every call is bounded by [`CALL_TIMEOUT`].

use std::path::{Path as FsPath, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic_prost::ProstCodec;

use crate::api::*;

/// How long one call may take before it fails (a speaker that stopped answering).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest message taken from the speaker: a table of some hundreds of thousands of
/// routes (the switch's memory is the bound).
pub const MAX_MESSAGE: usize = 128 << 20;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket could not be reached.
    #[error("cannot reach the BGP speaker's API at {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: tonic::transport::Error,
    },
    /// The speaker refused or failed the call.
    #[error("the BGP speaker refused {call}: {status}")]
    Call {
        /// The call.
        call: &'static str,
        /// Its answer.
        status: Box<tonic::Status>,
    },
}

/// A connection to one speaker.
#[derive(Clone)]
pub struct Client {
    inner: tonic::client::Grpc<Channel>,
}

macro_rules! path {
    ($name:literal) => {
        PathAndQuery::from_static(concat!("/apipb.GobgpApi/", $name))
    };
}

impl Client {
    /// Connects to the API socket at `path` (bounded by [`CALL_TIMEOUT`]).
    pub async fn connect(path: &FsPath) -> Result<Client, Error> {
        let at = path.to_path_buf();
        // (The URI is required and unused: the connector dials the socket.)
        let channel = Endpoint::from_static("http://gobgpd.invalid")
            .connect_timeout(CALL_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .connect_with_connector(tower::service_fn(move |_| {
                let at = at.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(at).await?)) }
            }))
            .await
            .map_err(|source| Error::Connect { path: path.to_path_buf(), source })?;
        // The watch's first answer is the speaker's whole table in one message: 100,000
        // routes make tens of MB, past gRPC's usual 4 MB bound.
        let inner = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_MESSAGE);
        Ok(Client { inner })
    }

    async fn unary<Q, A>(&mut self, call: &'static str, at: PathAndQuery, q: Q) -> Result<A, Error>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let fail = |status| Error::Call { call, status: Box::new(status) };
        self.inner.ready().await.map_err(|e| fail(tonic::Status::unavailable(e.to_string())))?;
        let r = self.inner.unary(tonic::Request::new(q), at, ProstCodec::<Q, A>::default()).await;
        r.map(tonic::Response::into_inner).map_err(fail)
    }

    async fn stream<Q, A>(&mut self, call: &'static str, at: PathAndQuery, q: Q) -> Result<tonic::Streaming<A>, Error>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let fail = |status| Error::Call { call, status: Box::new(status) };
        self.inner.ready().await.map_err(|e| fail(tonic::Status::unavailable(e.to_string())))?;
        let r = self.inner.server_streaming(tonic::Request::new(q), at, ProstCodec::<Q, A>::default()).await;
        r.map(tonic::Response::into_inner).map_err(fail)
    }

    /// The speaker's global settings (AS 0: BGP not started).
    pub async fn get_bgp(&mut self) -> Result<Global, Error> {
        let r: GetBgpResponse = self.unary("GetBgp", path!("GetBgp"), GetBgpRequest {}).await?;
        Ok(r.global.unwrap_or_default())
    }

    /// Starts BGP with `global`.
    pub async fn start_bgp(&mut self, global: Global) -> Result<(), Error> {
        let _: () = self.unary("StartBgp", path!("StartBgp"), StartBgpRequest { global: Some(global) }).await?;
        Ok(())
    }

    /// Adds a peer.
    pub async fn add_peer(&mut self, peer: Peer) -> Result<(), Error> {
        let _: () = self.unary("AddPeer", path!("AddPeer"), AddPeerRequest { peer: Some(peer) }).await?;
        Ok(())
    }

    /// Every peer and its state.
    pub async fn list_peers(&mut self) -> Result<Vec<Peer>, Error> {
        let mut s = self.stream("ListPeer", path!("ListPeer"), ListPeerRequest::default()).await?;
        let mut v = Vec::new();
        while let Some(r) = s.message().await.map_err(|e| Error::Call { call: "ListPeer", status: Box::new(e) })? {
            let r: ListPeerResponse = r;
            v.extend(r.peer);
        }
        Ok(v)
    }

    /// Announces `path`; returns its id.
    pub async fn add_path(&mut self, path: Path) -> Result<Vec<u8>, Error> {
        let q = AddPathRequest { table_type: TABLE_GLOBAL, path: Some(path) };
        let r: AddPathResponse = self.unary("AddPath", path!("AddPath"), q).await?;
        Ok(r.uuid)
    }

    /// Withdraws the path `AddPath` gave `uuid`.
    pub async fn delete_path(&mut self, uuid: Vec<u8>) -> Result<(), Error> {
        let q = DeletePathRequest { table_type: TABLE_GLOBAL, family: Some(Family::evpn()), path: None, uuid };
        let _: () = self.unary("DeletePath", path!("DeletePath"), q).await?;
        Ok(())
    }

    /// Withdraws every EVPN path this speaker originates (one left by an earlier run).
    pub async fn delete_all_paths(&mut self) -> Result<(), Error> {
        let q = DeletePathRequest { table_type: TABLE_GLOBAL, family: Some(Family::evpn()), path: None, uuid: vec![] };
        let _: () = self.unary("DeletePath", path!("DeletePath"), q).await?;
        Ok(())
    }

    /// The global table's EVPN destinations.
    pub async fn list_paths(&mut self) -> Result<Vec<Destination>, Error> {
        let q = ListPathRequest { table_type: TABLE_GLOBAL, family: Some(Family::evpn()) };
        let mut s = self.stream("ListPath", path!("ListPath"), q).await?;
        let mut v = Vec::new();
        while let Some(r) = s.message().await.map_err(|e| Error::Call { call: "ListPath", status: Box::new(e) })? {
            let r: ListPathResponse = r;
            v.extend(r.destination);
        }
        Ok(v)
    }

    /// Watches best-path changes (the current table first) and peers' state changes.
    pub async fn watch(&mut self) -> Result<tonic::Streaming<WatchEventResponse>, Error> {
        let q = WatchEventRequest {
            peer: Some(WatchPeer {}),
            table: Some(WatchTable { filters: vec![WatchTableFilter { r#type: 0, init: true }] }),
        };
        self.stream("WatchEvent", path!("WatchEvent"), q).await
    }
}
